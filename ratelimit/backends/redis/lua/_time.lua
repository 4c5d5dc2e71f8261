-- _time.lua: joined after the prelude (_helpers.lua, or _one.lua for the one-rule scripts),
-- which defines `times` (false: none). Sets `now`, in microseconds: ARGV[1] when given (an
-- injected clock, or the batch's instant: batch.py), else the server's TIME; and `injected`:
-- the time came from the caller's clock (a test's), not the server's ('' reads TIME; a batch
-- hands its calls the server's instant marked with a '+': batch.py).

local now = times and times[ARGV[1]]
local injected = ARGV[1] ~= '' and string.byte(ARGV[1]) ~= 43
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
elseif not now then
  now = tonumber(ARGV[1])
  if times then times[ARGV[1]] = now end
end
