-- reset.lua: forget what a plan's identifiers counted (reset()), and mark each reset at
-- now, so that a settle's refund of a call reserved before it takes nothing counted after
-- it (settle_windows.lua, settle_gcra.lua).
--
-- KEYS      the keys to delete (keys.py, plan_keys), then one reset mark per identifier.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   how many of KEYS are to be deleted; the rest are marks.
-- ARGV[3]   how long a mark is kept, in milliseconds.
--
-- Returns {now}. Runs after _now.lua, which script_engine.py joins in front of it.

local deleted = tonumber(ARGV[2])
for i = 1, deleted do redis.call('DEL', KEYS[i]) end
for i = deleted + 1, #KEYS do
  redis.call('SET', KEYS[i], digits(now), 'PX', tonumber(ARGV[3]))
end
return {now}
