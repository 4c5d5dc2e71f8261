-- _gcra.lua: a GCRA arrival time as a rule reads it, for gcra.lua and settle_gcra.lua. A
-- key holds "us:rem:count": whole microseconds, a remainder in 1/count of one, and the count
-- of the rule it was stored under (keys are per identifier and span). A rule of another
-- count (an override changed the rate) reads it rescaled: the hits held ahead of now carry
-- on, each one interval of that rule, at most ten years ahead (algorithms/gcra.py,
-- gcra_rescaled, computes the same: exactly below 2**53, else in doubles to whole us).

local MOST_AHEAD_US = 3650 * 86400000000

-- The arrival time in `key` as stored: us, rem, and the count it was stored under (0, 0
-- and `count` when none is).
local function read_stored(key, count)
  local stored = redis.call('GET', key)
  if not stored then return 0, 0, count end
  local a, b, c = string.match(stored, '^(%d+):?(%d*):?(%d*)$')
  return tonumber(a), tonumber(b) or 0, tonumber(c) or count
end

-- An arrival time stored under `was` as a rule of `count` reads it now.
local function rescale(us, rem, was, count)
  if was == count then return us, rem end
  if us < now or (us == now and rem == 0) then return 0, 0 end
  local ahead = (us - now) * was + rem  -- in 1/count of a us, whatever the count
  local ahead_us, ahead_rem = math.floor(ahead / count), 0
  if ahead < 9007199254740992 then
    if ahead_us * count > ahead then ahead_us = ahead_us - 1 end
    ahead_rem = ahead - ahead_us * count
  end
  if ahead_us >= MOST_AHEAD_US then return now + MOST_AHEAD_US, 0 end
  return now + ahead_us, ahead_rem
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
