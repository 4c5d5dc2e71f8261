-- counter_update.lua: Kong's counter API. Add to one window counter, return the sliding rate.
--
-- KEYS[1]   the identifier's counter hash, laid out as in window_counters.lua.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the window size S in microseconds.
-- ARGV[3]   the value to add to the current window (fractions and negatives allowed; 0 only
--           reads and writes nothing).
-- ARGV[4]   the previous window's weight, or "" for (S - elapsed) / S.
--
-- Returns   the rate after the addition, current + previous * weight, as a %.17g string.
--           When something was added, the key expires 2 * S from now (never sooner than it
--           already would).
--
-- Runs after _now.lua, which redis_script.py joins in front of it.

local size = tonumber(ARGV[2])
local value = tonumber(ARGV[3])
local key = KEYS[1]

local prefix = string.format('%.0f', size) .. ':'
local f = redis.call('HMGET', key, prefix .. '0', prefix .. '0w', prefix .. '1', prefix .. '1w')
-- a window held that is newer than `now`: the clock stepped back; count from its start
local newest = math.max(tonumber(f[2] or -1), tonumber(f[4] or -1))
if newest * size > now then now = newest * size end
local index = math.floor(now / size)
local c = index % 2
local current, previous = 0, 0
for _, slot in ipairs({{f[1], f[2]}, {f[3], f[4]}}) do
  if slot[2] and tonumber(slot[2]) == index then current = tonumber(slot[1]) end
  if slot[2] and tonumber(slot[2]) == index - 1 then previous = tonumber(slot[1]) end
end

current = current + value
local rate
if ARGV[4] == '' then
  rate = current + previous * (size - (now - index * size)) / size
else
  rate = current + previous * tonumber(ARGV[4])
end

if value ~= 0 then
  redis.call('HSET', key, prefix .. c, string.format('%.17g', current),
    prefix .. c .. 'w', string.format('%.0f', index))
  local ms = math.ceil(2 * size / 1000)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
return string.format('%.17g', rate)
