-- window_counters.lua: decide a whole rule tree on window counters and record the call,
-- atomically (the sliding window, or the fixed window).
--
-- KEYS[k]   one hash per identifier. Per window size S (microseconds) it has two slots,
--           s = 0 and 1: field "S:s" is the count (as %.17g) and "S:sw" the index of the
--           window that slot holds. Window i spans [i*S, (i+1)*S) and lives in slot i % 2.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the tree, as in sliding_log.lua: L, then per leaf its count and window size in
--           microseconds, then the prefix program.
-- ARGV[3]   per leaf, space-separated: the index k of its key in KEYS, or 0 when its
--           selector did not resolve (the rule is then never limited, records nothing).
-- ARGV[4]   the call's cost, fractions allowed.
-- ARGV[5]   "1" to record an allowed call, "0" to only decide (peek).
-- ARGV[6]   1 for the sliding window, 0 for the fixed window.
--
-- Returns   {allowed (1/0), now, current_1, previous_1, ..., current_L, previous_L}: now is
--           the time decided at (the start of the newest window held, if the clock went
--           back to before it); per
--           leaf the counts of its current and previous window before this call, as %.17g
--           strings. A leaf is limited when current + previous * (S - elapsed) / S + cost
--           exceeds its count (previous weight 0 for the fixed window). When allowed, every
--           (key, window size) got `cost` added to its current window, and every key expires
--           two of its largest windows from now (never sooner than it already would).
--
-- Runs after _now.lua and _tree.lua, which redis_script.py joins in front of it.

local cost = tonumber(ARGV[4])
local sliding = ARGV[6] == '1'

local function field(size, slot)
  return string.format('%.0f', size) .. ':' .. slot
end

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
    local f = redis.call('HMGET', KEYS[k], field(size, 0), field(size, 0) .. 'w',
      field(size, 1), field(size, 1) .. 'w')
    held[i] = f
    local newest = math.max(tonumber(f[2] or -1), tonumber(f[4] or -1))
    if newest * size > now then now = newest * size end
  end
end

local result = {0, string.format('%.0f', now)}
for i = 0, leaves - 1 do
  local k = slots[i + 1]
  local count = tree[2 + 2 * i]
  local size = tree[3 + 2 * i]
  local current, previous = 0, 0
  if k > 0 then
    local index = math.floor(now / size)
    local f = held[i]
    for _, slot in ipairs({{f[1], f[2]}, {f[3], f[4]}}) do
      if slot[2] and tonumber(slot[2]) == index then current = tonumber(slot[1]) end
      if slot[2] and tonumber(slot[2]) == index - 1 then previous = tonumber(slot[1]) end
    end
    current_of[k] = current_of[k] or {}
    current_of[k][size] = {index, current}
    ttl[k] = math.max(ttl[k] or 0, size)
    local rate = current
    if sliding then
      rate = current + previous * (size - (now - index * size)) / size
    end
    limited[i] = rate + cost > count
  else
    limited[i] = false
  end
  result[#result + 1] = string.format('%.17g', current)
  result[#result + 1] = string.format('%.17g', previous)
end

if tree_limited(limited) then return result end

result[1] = 1
if ARGV[5] == '0' then return result end  -- peek: decided, nothing recorded
for k, sizes in pairs(current_of) do
  local key = KEYS[k]
  for size, held in pairs(sizes) do
    local slot = held[1] % 2
    redis.call('HSET', key, field(size, slot), string.format('%.17g', held[2] + cost),
      field(size, slot) .. 'w', string.format('%.0f', held[1]))
  end
  local ms = math.ceil(2 * ttl[k] / 1000)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
return result
