-- envoy_incrby.lua: envoyproxy/ratelimit's fixed windows, counted as its service counts them.
--
-- KEYS      the window counters of one request (its keys: prefix, domain, entries, start).
-- ARGV      per key, in turn: the hits to add (0 only reads it) and its lifetime in seconds.
--
-- Returns   each key's count after the hits were added. Each key gets INCRBY then EXPIRE,
--           as its service's pipeline sends them (refused hits are counted too).
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('INCRBY', key, ARGV[2 * i - 1])
  redis.call('EXPIRE', key, ARGV[2 * i])
end
return out
