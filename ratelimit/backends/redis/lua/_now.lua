-- _now.lua: joined in front of every script by script_engine.py (Redis scripts cannot
-- import). Sets `now`, in microseconds: ARGV[1] when given (an injected clock), else the
-- server's TIME. Effects replication is asked for first, so that scripts reading TIME may
-- write on Redis versions before 7.

if redis.replicate_commands then redis.replicate_commands() end

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
