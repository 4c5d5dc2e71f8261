-- settle_windows.lua: settle a call on window counters, atomically (see
-- ratelimit/core/settling.py).
--
-- KEYS      as window_counters.lua: one hash per identifier; then, per identifier, its
--           reset mark (keys.py, reset_key): when it was last reset.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the tree, as window_counters.lua reads it.
-- ARGV[3]   per leaf, its key's index in KEYS, or 0 (the rule did not apply).
-- ARGV[4]   per leaf, space-separated: what to add now (an excess, above 0) or to take
--           back (a refund, below 0); leaves on one key carry the same.
-- ARGV[5]   the reservation's time (us): it names the window each size counted it in.
--
-- A refund takes back from the reservation's window while a slot holds it, never below 0,
-- and nothing when the identifier was reset since the reservation (its mark >= ARGV[5]);
-- an excess is added to the current window (where a clock that stepped back finds a newer
-- window held, at that window's start, as window_counters.lua decides), past the limit,
-- and the key kept two of that size from now. Returns {now}.
--
-- Runs after _helpers.lua, _time.lua, _tree.lua and _windows.lua, which scripts.py joins in front.

local todo, seen = {}, {}  -- per (key, size) once: {k, size, delta}
for i = 0, tree[1] - 1 do
  local k, d = slots[i + 1], costs[i + 1]
  if k > 0 and d ~= 0 then
    local size = tree[3 + 2 * i]
    local id = k .. ' ' .. size
    if not seen[id] then
      seen[id] = true
      todo[#todo + 1] = {k, size, d}
    end
  end
end

local held = {}
for n, t in ipairs(todo) do
  held[n] = read_windows(KEYS[t[1]], t[2])
  local newest = newest_window(held[n])
  if newest * t[2] > now then now = newest * t[2] end
end

local at = tonumber(ARGV[5])
local marks = #KEYS / 2
for n, t in ipairs(todo) do
  local key, size, d, f = KEYS[t[1]], t[2], t[3], held[n]
  local reset = d < 0 and redis.call('GET', KEYS[marks + t[1]])
  if reset and tonumber(reset) >= at then
    -- reserved before the reset, which forgot it: nothing to take back
  elseif d < 0 then
    local index = math.floor(at / size)
    for s = 0, 1 do
      if f[2 * s + 2] and tonumber(f[2 * s + 2]) == index then
        write_window(key, size, index, math.max(tonumber(f[2 * s + 1]) + d, 0))
      end
    end
  else
    local index = math.floor(now / size)
    local current = window_counts(f, index)
    write_window(key, size, index, current + d)
    keep_windows(key, size)
  end
end
return {now}  -- a whole number below 2**53: an exact integer reply
