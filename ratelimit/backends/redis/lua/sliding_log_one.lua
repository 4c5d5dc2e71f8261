-- sliding_log_one.lua: sliding_log.lua for a tree of one rule whose selector resolved (most
-- limits), on its own: no tree to parse and no caches to make (its prelude is _one.lua),
-- which is most of a lone call's time on Redis. The rule is decided by _log_one.lua,
-- as sliding_log.lua decides a tree of one leaf: the same KEYS, ARGV, commands,
-- stored state and reply (tests/test_sliding_log_one.py reads them off MONITOR).
-- scripts.py sends it where ARGV[2] is "1 count span 0 0" and ARGV[3] is "1".
--
-- KEYS[1]   the list (hit timestamps in microseconds, newest first); KEYS[2] its companion.
-- ARGV[1]   now in microseconds ('+' first from a batch), or "" to read the server's TIME.
-- ARGV[2]   "1 count span_us 0 0";  ARGV[3] "1";  ARGV[4] the cost;  ARGV[5] "1" to record.
-- Returns   {allowed (1/0), now, hits, oldest}, as sliding_log.lua.
--
-- Runs after _one.lua and _time.lua, which scripts.py joins in front of it.

local _, _, count, span = string.find(ARGV[2], '^1 (%d+) (%d+)')
count, span = tonumber(count), tonumber(span)
local k, cost = 1, tonumber(ARGV[4])
local lengths, lists = {}, 1  -- as _log.lua has them
local function digits(x)  -- as _helpers.lua's, with no cache
  return string.format('%d', x)
end
--@ _log_one.lua
