-- window_counters.lua: decide a whole rule tree on window counters and record the call,
-- atomically (the sliding window, or the fixed window).
--
-- KEYS[k]   one hash per identifier: per window size, two slots (see _windows.lua).
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the tree, as in sliding_log.lua: L, then per leaf its count and window size in
--           microseconds, then the prefix program.
-- ARGV[3]   per leaf, space-separated: the index k of its key in KEYS, or 0 when its
--           selector did not resolve (the rule is then never limited, records nothing).
-- ARGV[4]   the call's cost, fractions allowed, on every key; or one cost per key,
--           space-separated, in the order of KEYS.
-- ARGV[5]   "1" to record an allowed call, "0" to only decide (peek), "2" to check at
--           exactly ARGV[1] (spanning.py: a held part read back; nothing recorded).
-- ARGV[6]   1 for the sliding window, 0 for the fixed window.
--
-- Returns   {allowed (1/0), now, current_1, previous_1, ..., current_L, previous_L}: now is
--           the time decided at (the start of the newest window held, if the clock went
--           back to before it); per
--           leaf the counts of its current and previous window before this call, as %.17g
--           strings. A leaf is limited when current + previous * (S - elapsed) / S + cost
--           exceeds its count (previous weight 0 for the fixed window). When allowed, every
--           (key, window size) got `cost` added to its current window, and every key expires
--           two to three of its largest windows from now (never sooner than it already
--           would; see keep_windows).
--
-- Runs after _helpers.lua, _time.lua, _tree.lua and _windows.lua, which scripts.py joins in front.

local sliding = ARGV[6] == '1'

local leaves = tree[1]
local limited = {}
local current_of, ttl = {}, {}  -- per key: per size, {window index, its count}; largest size

-- First every leaf's two slots; a slot holding a window newer than `now` means the clock
-- stepped back: the call is then made at the start of the newest window held (where the
-- previous window weighs fully), so a clock going back never admits more.
local held = {}
for i = 0, leaves - 1 do
  local k = slots[i + 1]
  if k > 0 then
    local size = tree[3 + 2 * i]
    local f = read_windows(KEYS[k], size)
    held[i] = f
    local newest = newest_window(f)
    if newest * size > now and ARGV[5] ~= '2' then now = newest * size end
  end
end

local result = {0, now}  -- a whole number below 2**53: an exact integer reply
for i = 0, leaves - 1 do
  local k = slots[i + 1]
  local count = tree[2 + 2 * i]
  local size = tree[3 + 2 * i]
  local current, previous = 0, 0
  if k > 0 then
    local index = math.floor(now / size)
    current, previous = window_counts(held[i], index)
    current_of[k] = current_of[k] or {}
    current_of[k][size] = {index, current}
    ttl[k] = math.max(ttl[k] or 0, size)
    local rate = current
    if sliding then
      rate = current + previous * (size - (now - index * size)) / size
    end
    limited[i] = rate + cost_of(k) > count
  else
    limited[i] = false
  end
  result[#result + 1] = string.format('%.17g', current)
  result[#result + 1] = string.format('%.17g', previous)
end

if tree_limited(limited) then return result end

result[1] = 1
if ARGV[5] ~= '1' then return result end  -- peek or check: decided, nothing recorded
for k, sizes in pairs(current_of) do
  local key = KEYS[k]
  for size, held in pairs(sizes) do
    write_window(key, size, held[1], held[2] + cost_of(k))
  end
  keep_windows(key, ttl[k], true)
end
return result
