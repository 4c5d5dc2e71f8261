-- _one.lua: the prelude of the one-rule scripts (sliding_log_one.lua, gcra_one.lua), in
-- _helpers.lua's place: a call of one rule parses no tree and formats few numbers, so it
-- makes none of _helpers.lua's caches. Defines `times` as false, for _time.lua.

if redis.replicate_commands then redis.replicate_commands() end

local times = false  -- _time.lua keeps no parsed time
