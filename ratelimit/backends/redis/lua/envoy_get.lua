-- envoy_get.lua: the counts of envoyproxy/ratelimit's window counters, adding nothing.
--
-- KEYS      window counters.
-- ARGV      none.
--
-- Returns   each key's count, 0 for a key that does not exist.
local out = {}
for i, key in ipairs(KEYS) do out[i] = tonumber(redis.call('GET', key) or '0') end
return out
