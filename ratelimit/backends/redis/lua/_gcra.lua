-- _gcra.lua: a GCRA arrival time as a rule reads it, as functions for gcra.lua and
-- settle_gcra.lua (joined after _helpers.lua, _time.lua and _tree.lua), their bodies the
-- blocks that gcra_one.lua joins inline. A key holds "us:rem:count": whole microseconds, a
-- remainder in 1/count of one, and the count of the rule it was stored under (keys are per
-- identifier and span). A rule of another count (an override changed the rate) reads it
-- rescaled (algorithms/gcra.py, gcra_rescaled, computes the same: exactly below 2**53, else
-- in doubles to whole us).

-- The arrival time in `key` as stored: us, rem, and the count it was stored under (0, 0
-- and `count` when none is).
local function read_stored(key, count)
--@ _gcra_read.lua
  return us, rem, was
end

-- An arrival time stored under `was` as a rule of `count` reads it now.
local function rescale(us, rem, was, count)
--@ _gcra_rescale.lua
  return us, rem
end

-- The arrival time in `key` as a rule of `count` reads it now: us, rem (0, 0 when none),
-- and whether it was stored under another count (then rescaled).
local function read_arrival(key, count)
  local us, rem, was = read_stored(key, count)
  us, rem = rescale(us, rem, was, count)
  return us, rem, was ~= count
end

-- What a key holds: "us:rem:count" (%d: exact below 2**53, and cheaper than %.0f).
local function arrival_text(us, rem, count)
  return string.format('%d:%d:%d', us, rem, count)
end
