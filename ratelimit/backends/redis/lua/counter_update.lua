-- counter_update.lua: Kong's counter API. Add to one window counter, return the sliding rate.
--
-- KEYS[1]   the identifier's counter hash (see _windows.lua).
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
-- Runs after _helpers.lua, _time.lua and _windows.lua, which the engine joins in front.

local size = tonumber(ARGV[2])
local value = tonumber(ARGV[3])
local key = KEYS[1]

local f = read_windows(key, size)
-- a window held that is newer than `now`: the clock stepped back; count from its start
local newest = newest_window(f)
if newest * size > now then now = newest * size end
local index = math.floor(now / size)
local current, previous = window_counts(f, index)

current = current + value
local rate
if ARGV[4] == '' then
  rate = current + previous * (size - (now - index * size)) / size
else
  rate = current + previous * tonumber(ARGV[4])
end

if value ~= 0 then
  write_window(key, size, index, current)
  keep_windows(key, size)
end
return string.format('%.17g', rate)
