-- _gcra.lua: a GCRA arrival time as a rule reads it, for gcra.lua, gcra_one.lua and
-- settle_gcra.lua (joined after the prelude and _time.lua, which define `now`, `injected`). A
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

-- One rule of `count` hits per `span` with `burst`, on arrival time `key`, for a call of
-- `cost` (most limits: gcra.lua's tree of one leaf, and all of gcra_one.lua): decided, and
-- unless ARGV[5] is "0" written: admitted, the push (never behind what was read); refused,
-- what was read, when it was stored under another count. Returns the scripts' reply.
local function decide_one(key, count, span, burst, cost)
  local us, rem, was = read_stored(key, count)
  us, rem = rescale(us, rem, was, count)
  local q, r = math.floor(span / count), span % count
  local tol = burst * r
  local tol_us, tol_rem = burst * q + math.floor(tol / count), tol % count
  local start_us, start_rem = us, rem
  if us < now or (us == now and rem == 0) then start_us, start_rem = now, 0 end
  local pushed = start_rem + cost * r
  local new_us, new_rem = start_us + cost * q + math.floor(pushed / count), pushed % count
  local ahead = new_us - now
  local allowed = ahead < tol_us or (ahead == tol_us and new_rem <= tol_rem)
  if ARGV[5] ~= '0' and (allowed or was ~= count) then
    if not allowed then new_us, new_rem = us, rem end
    local keep = math.max(new_us - now + 1, 1)
    if injected then keep = math.max(keep, tol_us + 1, 3600000000) end
    local ms = string.format('%d', math.ceil(keep / 1000))  -- not Redis's %.17g
    redis.call('SET', key, arrival_text(new_us, new_rem, count), 'PX', ms)
  end
  if allowed then return {1, now, us, rem} end
  return {0, now, us, rem}
end
