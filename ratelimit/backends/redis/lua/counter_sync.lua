-- counter_sync.lua: push one key's local window diffs and fetch its totals (sync_rate > 0).
--
-- KEYS[1]   an identifier's counter hash (see _windows.lua).
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   space-separated triples "size index diff": add `diff` to window `index` of
--           window size `size` (microseconds). A diff of 0 only asks for the totals. A diff
--           for a window older than the one its slot holds is dropped (that window is over).
--
-- Returns   {now, size_1, index_a, count_a, index_b, count_b, size_2, ...}: per window size
--           named in ARGV[2], both slots (window index and count, as strings; -1 and 0 for
--           an empty slot). When something was added, the key expires two of its largest
--           windows from now (never sooner than it already would).
--
-- Runs after _helpers.lua, _time.lua and _windows.lua, which the engine joins in front.


local key = KEYS[1]
local numbers = {}
for n in string.gmatch(ARGV[2], '%S+') do numbers[#numbers + 1] = tonumber(n) end

local wrote, largest, sizes, seen = false, 0, {}, {}
for i = 1, #numbers, 3 do
  local size, index, diff = numbers[i], numbers[i + 1], numbers[i + 2]
  if diff ~= 0 then
    local f = read_windows(key, size)
    local s = index % 2
    local held_index = tonumber(f[2 * s + 2] or -1)
    if held_index == index then
      write_window(key, size, index, tonumber(f[2 * s + 1]) + diff)
      wrote = true
    elseif held_index < index then  -- an older window in the slot: this one replaces it
      write_window(key, size, index, diff)
      wrote = true
    end
    largest = math.max(largest, size)
  end
  if not seen[size] then
    seen[size] = true
    sizes[#sizes + 1] = size
  end
end

if wrote then keep_windows(key, largest) end

local result = {string.format('%.0f', now)}
for _, size in ipairs(sizes) do
  local f = read_windows(key, size)
  result[#result + 1] = string.format('%.0f', size)
  result[#result + 1] = f[2] or '-1'
  result[#result + 1] = f[1] or '0'
  result[#result + 1] = f[4] or '-1'
  result[#result + 1] = f[3] or '0'
end
return result
