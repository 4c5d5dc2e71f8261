-- _gcra_rescale.lua: a block, joined where a script names it: `us`, `rem` (stored under
-- `was`) as a rule of `count` reads them now. The hits held ahead of now carry on, each one
-- interval of that rule, at most ten years ahead; a time already passed reads 0, 0.
if was ~= count then
  if us < now or (us == now and rem == 0) then
    us, rem = 0, 0
  else
    local ahead = (us - now) * was + rem  -- in 1/count of a us, whatever the count
    local ahead_us, ahead_rem = math.floor(ahead / count), 0
    if ahead < 9007199254740992 then
      if ahead_us * count > ahead then ahead_us = ahead_us - 1 end
      ahead_rem = ahead - ahead_us * count
    end
    if ahead_us >= 3650 * 86400000000 then  -- at most ten years ahead
      us, rem = now + 3650 * 86400000000, 0
    else
      us, rem = now + ahead_us, ahead_rem
    end
  end
end
