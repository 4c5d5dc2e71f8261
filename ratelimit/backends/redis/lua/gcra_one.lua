-- gcra_one.lua: gcra.lua for a tree of one rule whose selector resolved (most limits), on
-- its own: no tree to parse, no helpers to make, which is most of a lone call's time on
-- Redis. Same KEYS, ARGV and return value as gcra.lua, whose one-rule branch it must match
-- step for step (same commands in the same order, same stored string and expiry, same
-- reply; held together by tests/test_gcra_one.py, with _now.lua's `now` and `injected`
-- and _gcra.lua's read_stored, rescale and arrival_text written out); scripts.py sends it
-- where ARGV[2] is "1 count span 0 0" and ARGV[3] is "1".
--
-- KEYS[1]   the arrival time, "us:rem:count" (gcra.lua).
-- ARGV[1]   now in microseconds ('+' first from a batch: the server's), or "" to read the
--           server's TIME.
-- ARGV[2]   "1 count span_us 0 0";  ARGV[3] "1";  ARGV[4] the cost;  ARGV[5] "1" to
--           record;  ARGV[6] the burst.
-- Returns   {allowed (1/0), now, us, rem}, as gcra.lua.

if redis.replicate_commands then redis.replicate_commands() end

local now
-- an injected clock (a test's) keeps keys an hour at least: Redis expires them on its own
local injected = ARGV[1] ~= '' and string.byte(ARGV[1]) ~= 43
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local _, _, count, span = string.find(ARGV[2], '^1 (%d+) (%d+)')
count, span = tonumber(count), tonumber(span)
local cost, burst = tonumber(ARGV[4]), tonumber(ARGV[6])
local key = KEYS[1]

-- _gcra.lua's read_stored(key, count), then rescale(us, rem, was, count)
local us, rem, was = 0, 0, count
local stored = redis.call('GET', key)
if stored then
  local a, b, c = string.match(stored, '^(%d+):?(%d*):?(%d*)$')
  us, rem, was = tonumber(a), tonumber(b) or 0, tonumber(c) or count
end
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
    if ahead_us >= 3650 * 86400000000 then
      us, rem = now + 3650 * 86400000000, 0
    else
      us, rem = now + ahead_us, ahead_rem
    end
  end
end

-- gcra.lua's one-rule branch
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
  redis.call('SET', key, string.format('%d:%d:%d', new_us, new_rem, count), 'PX', ms)
end
if allowed then return {1, now, us, rem} end
return {0, now, us, rem}
