-- _gcra_one.lua: a block, joined where a script names it: one rule of `count` hits per
-- `span` with `burst`, on arrival time `key`, for a call of `cost` (most limits: gcra.lua's
-- tree of one leaf, and all of gcra_one.lua) decided, and if ARGV[5] is "1" written:
-- admitted, the push (never behind what was read); refused, what was read, when it was
-- stored under another count. Answered with the scripts' reply. Inline, not a function: a
-- lone call of one rule makes no closure.
--@ _gcra_read.lua
--@ _gcra_rescale.lua
local q, r = math.floor(span / count), span % count
local tol = burst * r
local tol_us, tol_rem = burst * q + math.floor(tol / count), tol % count
local start_us, start_rem = us, rem
if us < now or (us == now and rem == 0) then start_us, start_rem = now, 0 end
local pushed = start_rem + cost * r
local new_us, new_rem = start_us + cost * q + math.floor(pushed / count), pushed % count
local ahead = new_us - now
local allowed = ahead < tol_us or (ahead == tol_us and new_rem <= tol_rem)
if ARGV[5] == '1' and (allowed or was ~= count) then
  if not allowed then new_us, new_rem = us, rem end
  local keep = math.max(new_us - now + 1, 1)
  if injected then keep = math.max(keep, tol_us + 1, 3600000000) end
  local ms = string.format('%d', math.ceil(keep / 1000))  -- not Redis's %.17g
  redis.call('SET', key, string.format('%d:%d:%d', new_us, new_rem, count), 'PX', ms)
end
if allowed then return {1, now, us, rem} end
return {0, now, us, rem}
