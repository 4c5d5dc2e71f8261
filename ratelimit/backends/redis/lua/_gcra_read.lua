-- _gcra_read.lua: a block, joined where a script names it: the arrival time in `key` as
-- stored into `us`, `rem` and `was`, the count it was stored under (0, 0 and `count` when
-- none is).
local us, rem, was = 0, 0, count
local stored = redis.call('GET', key)
if stored then
  local a, b, c = string.match(stored, '^(%d+):?(%d*):?(%d*)$')
  us, rem, was = tonumber(a), tonumber(b) or 0, tonumber(c) or count
end
