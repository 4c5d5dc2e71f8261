-- gcra_one.lua: gcra.lua for a tree of one rule whose selector resolved (most limits), on
-- its own: no tree to parse and no caches to make (its prelude is _one.lua), which is most
-- of a lone call's time on Redis. The rule is decided by _gcra_one.lua, as gcra.lua
-- decides a tree of one leaf: the same KEYS, ARGV, commands in the same order,
-- stored string and expiry, and reply (tests/test_gcra_one.py reads them off MONITOR).
-- scripts.py sends it where ARGV[2] is "1 count span 0 0" and ARGV[3] is "1".
--
-- KEYS[1]   the arrival time, "us:rem:count" (gcra.lua).
-- ARGV[1]   now in microseconds ('+' first from a batch: the server's), or "" to read the
--           server's TIME.
-- ARGV[2]   "1 count span_us 0 0";  ARGV[3] "1";  ARGV[4] the cost;  ARGV[5] "1" to
--           record;  ARGV[6] the burst.
-- Returns   {allowed (1/0), now, us, rem}, as gcra.lua.
--
-- Runs after _one.lua and _time.lua, which scripts.py joins in front of it.

local _, _, count, span = string.find(ARGV[2], '^1 (%d+) (%d+)')
count, span = tonumber(count), tonumber(span)
local key, burst, cost = KEYS[1], tonumber(ARGV[6]), tonumber(ARGV[4])
--@ _gcra_one.lua
