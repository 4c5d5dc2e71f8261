-- reset.lua: forget what a plan's identifiers counted (reset()), and mark each reset at
-- now, so that a settle's refund of a call reserved before it takes nothing counted after
-- it (settle_windows.lua, settle_gcra.lua, settle_log.lua).
--
-- KEYS      the keys to delete (keys.py, plan_keys), then one reset mark per identifier.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   how many of KEYS are to be deleted; the rest are marks.
-- ARGV[3]   how long a mark is kept at least, in milliseconds (the plan's own rules).
--
-- A mark is kept as long as the longest of what it forgot would have been kept (whatever
-- rules wrote it: a refund only takes from what is held, and every key is kept while it
-- holds something) and as an earlier mark still is. Returns {now}. Runs after _helpers.lua
-- and _time.lua, which the script engine joins in front of it.

local deleted = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
for i = 1, #KEYS do
  keep = math.max(keep, redis.call('PTTL', KEYS[i]))  -- -2 (none), -1 (no expiry: unheld)
end
for i = 1, deleted do redis.call('DEL', KEYS[i]) end
for i = deleted + 1, #KEYS do
  redis.call('SET', KEYS[i], digits(now), 'PX', keep)
end
return {now}
