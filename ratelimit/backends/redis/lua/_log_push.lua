-- _log_push.lua: a block, joined where a script names it: push `cost` hits now (at the
-- newest hit's time if that is later, so that the list stays newest first if the clock
-- stepped back) on list KEYS[k], whose companion KEYS[lists + k] holds the largest count any
-- limit on it asked to keep; at most `most` are pushed (the larger of `count` and that:
-- more change no decision). Leaves `key`, `kept`, `new` (the list was empty: its companion,
-- of the same time to live, is gone with it), `held`, `most` and `length` (the list's length
-- now) for _log_keep.lua.
local key, kept = KEYS[k], KEYS[lists + k]
local length = lengths[k] or redis.call('LLEN', key)
local new = length == 0
local held = 0
local stamp = digits(now)
if not new then
  held = tonumber(redis.call('GET', kept) or 0)
  -- Stamps are written as `digits` writes them: of one length, the text orders them as
  -- their numbers (saving C's strtod, dear on sixteen digits); of two, the numbers are
  -- compared.
  local newest = redis.call('LINDEX', key, '0')
  if newest then
    if #newest == #stamp then
      if newest > stamp then stamp = newest end
    elseif tonumber(newest) > tonumber(stamp) then
      stamp = newest
    end
  end
end
local most = math.max(count, held)
local left = math.min(cost, most)
if left == 1 then  -- one hit (most calls): no chunk to build
  length = redis.call('LPUSH', key, stamp)
  left = 0
end
while left > 0 do  -- in chunks, under Lua's limit on unpack()
  local chunk = {}
  for n = 1, math.min(left, 1000) do chunk[n] = stamp end
  length = redis.call('LPUSH', key, unpack(chunk))
  left = left - #chunk
end
lengths[k] = length
