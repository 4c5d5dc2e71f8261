-- _windows.lua: the window-counter hash, for every script that reads or writes one. The
-- command engine names the same fields (keys.py, window_fields) and reads them in the same
-- order (windows.py).
--
-- Per window size S (microseconds) two slots, s = 0 and 1: field "S:s" holds a count (as
-- %.17g) and "S:sw" the index of the window in that slot. Window i spans [i*S, (i+1)*S)
-- and lives in slot i % 2, so the current window and the one before it are both held.

-- The four fields of size S, in the order they are read: count 0, index 0, count 1, index 1.
-- (Made once per size and script call, or per batch: `cache` is _helpers.lua's.)
local function window_fields(size)
  local fields = cache(1)
  local f = fields[size]
  if not f then
    local prefix = digits(size) .. ':'
    f = {prefix .. '0', prefix .. '0w', prefix .. '1', prefix .. '1w'}
    fields[size] = f
  end
  return f[1], f[2], f[3], f[4]
end

-- The slots of size S in `key`, as HMGET returns them (false for a field not held).
local function read_windows(key, size)
  return redis.call('HMGET', key, window_fields(size))
end

-- The newest window index among the slots `f`, or -1.
local function newest_window(f)
  return math.max(tonumber(f[2] or -1), tonumber(f[4] or -1))
end

-- The count of window `index` and of window `index - 1` in the slots `f` (0 when not held).
local function window_counts(f, index)
  local current, previous = 0, 0
  for s = 0, 1 do
    local held = f[2 * s + 2]
    if held and tonumber(held) == index then current = tonumber(f[2 * s + 1]) end
    if held and tonumber(held) == index - 1 then previous = tonumber(f[2 * s + 1]) end
  end
  return current, previous
end

-- Hold `count` as window `index` of size S, in its slot (index % 2).
local function write_window(key, size, index, count)
  local c0, i0, c1, i1 = window_fields(size)
  local count_field, index_field = c0, i0
  if index % 2 == 1 then count_field, index_field = c1, i1 end
  redis.call('HSET', key, count_field, string.format('%.17g', count),
    index_field, digits(index))
end

-- Keep `key` for at least two windows of size S from now (never less than it would). With
-- `renew`, a key that needs it gets three: a key decided on again and again is then
-- extended once a window, not at every call (one PTTL instead of PTTL and PEXPIRE).
local function keep_windows(key, size, renew)
  local ms = math.ceil(2 * size / 1000)
  if redis.call('PTTL', key) < ms then
    if renew then ms = math.ceil(3 * size / 1000) end
    redis.call('PEXPIRE', key, ms)
  end
end
