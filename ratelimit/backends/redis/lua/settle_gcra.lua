-- settle_gcra.lua: settle a call on GCRA arrival times, atomically (see
-- ratelimit/core/settling.py and algorithms/gcra.py, gcra_settled).
--
-- KEYS      as gcra.lua: one string per (identifier, span); then, per key, its
--           identifier's reset mark (keys.py, reset_key): when it was last reset.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the tree, as gcra.lua reads it.
-- ARGV[3]   per leaf, its key's index in KEYS, or 0 (the rule did not apply).
-- ARGV[4]   per leaf, space-separated: whole hits to record now (an excess, above 0) or to
--           take back (a refund, below 0: at most what the reservation moved the arrival
--           time, which the client computed); the first leaf on a key settles it (leaves
--           of several counts of one span share a key: layout.arrival_slots).
-- ARGV[5]   the reservation's time (unused here: a refund is bounded by now).
-- ARGV[6]   per leaf, space-separated: its burst.
-- ARGV[8]   optional, per leaf, space-separated: "us rem", where the reservation pushed its
--           key's arrival time from (a held part of a call decided by parts, spanning.py):
--           a refund then never takes back more than it pushed (h - from), exactly, even
--           where the burst capped the push at less than whole intervals.
-- ARGV[7]   per leaf, space-separated: "us rem", the arrival time the reservation pushed
--           its key's to (until when it holds); empty when nothing is refunded.
--
-- An excess pushes the arrival time on from max(arrival, now), a burst at a time so that
-- every step stays exact in doubles, by at most 1000 bursts and to at most ten years
-- ahead; a refund pulls it back, never by more than the reservation still holds (its
-- arrival time less now: what has drained never comes back) and never before now, and
-- not at all when the identifier was reset since the reservation (its mark >= ARGV[5]).
-- The key is settled at the count it is stored under now (an override may have changed
-- the rate since the reservation, _gcra.lua): the hits settled, and what the reservation
-- still holds, count as hits of that count, and it is written back under it (never under
-- the reservation's, which would drain it at the old rate). Returns {now}.
--
-- Runs after _helpers.lua, _time.lua, _tree.lua and _gcra.lua, which scripts.py joins in front.

local bursts = numbers(ARGV[6], '%d+')
local held = numbers(ARGV[7] or '', '%d+')
local from = numbers(ARGV[8] or '', '%d+')
local EXCESS_BURSTS, MOST_AHEAD = 1000, 3650 * 86400000000

local marks, at = #KEYS / 2, tonumber(ARGV[5])
local done = {}
for i = 0, tree[1] - 1 do
  local k, d = slots[i + 1], costs[i + 1]
  local first = k > 0 and not done[k]  -- the first leaf on a key settles it
  if first then done[k] = true end
  if first and d < 0 then
    local reset = redis.call('GET', KEYS[marks + k])
    if reset and tonumber(reset) >= at then d = 0 end  -- reserved before a reset: forgotten
  end
  if first and d ~= 0 then
    local reserved, span, burst = tree[2 + 2 * i], tree[3 + 2 * i], bursts[i + 1]
    -- settled at the rate the key holds now (an override may have changed it since the
    -- reservation): hits, and what the reservation still holds, in its count
    local us, rem, count = read_stored(KEYS[k], reserved)
    local q, r = math.floor(span / count), span % count  -- the interval: q + r / count
    local h_us, h_rem = rescale(held[2 * i + 1] or 0, held[2 * i + 2] or 0, reserved, count)
    local write = true
    if d > 0 then
      if us < now or (us == now and rem == 0) then us, rem = now, 0 end
      local left = math.min(d, EXCESS_BURSTS * burst)
      while left > 0 do
        local step = math.min(left, burst)
        local pushed = rem + step * r
        us, rem = us + step * q + math.floor(pushed / count), pushed % count
        left = left - step
        if us - now >= MOST_AHEAD then
          us, rem, left = now + MOST_AHEAD, 0, 0
        end
      end
    elseif (us > now or (us == now and rem > 0)) and (h_us > now or (h_us == now and h_rem > 0)) then
      -- not before the stored time less what the reservation still holds (h - now)
      local floor_us, floor_rem = us - (h_us - now), rem - h_rem
      if floor_rem < 0 then floor_us, floor_rem = floor_us - 1, floor_rem + count end
      if from[2 * i + 1] then  -- not before the stored time less what it pushed (h - from)
        local f_us, f_rem = rescale(from[2 * i + 1], from[2 * i + 2], reserved, count)
        local by_us, by_rem = us - (h_us - f_us), rem - (h_rem - f_rem)
        while by_rem < 0 do by_us, by_rem = by_us - 1, by_rem + count end
        while by_rem >= count do by_us, by_rem = by_us + 1, by_rem - count end
        if by_us > floor_us or (by_us == floor_us and by_rem > floor_rem) then
          floor_us, floor_rem = by_us, by_rem
        end
      end
      local taken = rem - (-d) * r  -- may be negative: borrow whole microseconds
      local borrow = math.ceil(-taken / count)
      if borrow < 0 then borrow = 0 end
      us, rem = us - (-d) * q - borrow, taken + borrow * count
      if us < floor_us or (us == floor_us and rem < floor_rem) then
        us, rem = floor_us, floor_rem
      end
      if us < now then us, rem = now, 0 end
    else
      write = false  -- the bucket is full, or the reservation drained: nothing to take back
    end
    if write then
      local value = arrival_text(us, rem, count)
      local keep = us - now + 1
      if injected then  -- an injected clock: kept as gcra.lua keeps it
        keep = math.max(keep, burst * q + math.floor(burst * r / count) + 1, 3600000000)
      end
      redis.call('SET', KEYS[k], value, 'PX', math.ceil(keep / 1000))
    end
  end
end
return {now}  -- a whole number below 2**53: an exact integer reply
