-- gcra.lua: decide a whole rule tree by GCRA (a token bucket kept as one arrival time per
-- identifier and rule) and push the arrival times on, atomically.
--
-- KEYS[k]   one string per (identifier, span): the theoretical arrival time, "us:rem:count"
--           (whole microseconds, a remainder in 1/count of a microsecond, exact, see
--           algorithms.Arrival; and the count of the rule it was stored under, which a rule
--           of another count rescales: _gcra.lua). Absent: nothing counted.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the tree, as in sliding_log.lua: L, then per leaf its count and span in
--           microseconds, then the prefix program.
-- ARGV[3]   per leaf, space-separated: the index k of its key in KEYS, or 0 when its
--           selector did not resolve (the rule is then never limited, records nothing).
-- ARGV[4]   the call's cost, a whole number of hits (at most every leaf's burst), on every
--           key; or one cost per key, space-separated, in the order of KEYS.
-- ARGV[5]   "1" to record an allowed call, "0" to only decide (peek), "2" to check at
--           exactly ARGV[1] (spanning.py: a held part read back; nothing recorded), "3" to
--           record an allowed call uncapped (spanning.py: a held part, whose every hit a
--           later check must see: a limited leaf is pushed by the call's whole cost).
-- ARGV[6]   per leaf, space-separated: its burst (how many hits may come at once).
--
-- Returns   {allowed (1/0), now, us_1, rem_1, ..., us_L, rem_L}: per leaf the arrival time
--           read (0 0 when none), rescaled to its count: every leaf of one span on one
--           identifier reads one key (layout.arrival_slots). A leaf is limited when
--           max(arrival, now) + cost * span / count runs more than burst * span / count
--           ahead of now. When allowed, every key
--           gets that pushed arrival time (at most the burst's tolerance ahead of now, unless
--           a settle's excess already put it further: it never moves back) and
--           expires when it has passed, when the bucket is full again. With an injected
--           clock (tests) Redis's expiry runs on another clock than the decisions, so a key
--           is kept for an hour or its rule's tolerance instead, whichever is longer.
--           A key read by leaves of several counts keeps the push holding the most hits,
--           stored under the smallest count (algorithms.gcra_shared_next).
--           When refused (and recording), a key read under another count (an override
--           changed the rate: _gcra.lua) is written as read, under that count.
--
-- Every quantity is a whole number below 2**53 (settings.check_gcra_rule), so Lua's doubles
-- compute it exactly. Runs after _helpers.lua, _time.lua, _tree.lua and _gcra.lua, which
-- scripts.py joins in front.

local bursts = numbers(ARGV[6], '%d+')

local leaves = tree[1]

-- One rule (most limits): what the loop and writes below do for it, without their tables.
if leaves == 1 and slots[1] > 0 then
  local key, count, span, burst = KEYS[slots[1]], tree[2], tree[3], bursts[1]
  local cost = cost_of(slots[1])
--@ _gcra_one.lua
end

local limited = {}
local result = {0, now}  -- whole numbers below 2**53: exact integer replies
-- per key: {us, rem, count as stored; the count it is stored under (its leaves' smallest,
-- then of the smallest burst), that leaf's tolerance in us; per leaf: {us, rem, count}}
local keys = {}

for i = 0, leaves - 1 do
  local k = slots[i + 1]
  local us, rem = 0, 0
  limited[i] = false
  if k > 0 then
    local count, span, burst = tree[2 + 2 * i], tree[3 + 2 * i], bursts[i + 1]
    local cost = cost_of(k)
    local key = keys[k]
    if not key then
      local s_us, s_rem, was = read_stored(KEYS[k], count)
      key = {s_us, s_rem, was, count, burst, 0, {}}
      keys[k] = key
    end
    us, rem = rescale(key[1], key[2], key[3], count)
    -- the interval span / count is q + r / count; the tolerance burst intervals
    local q, r = math.floor(span / count), span % count
    local tol = burst * r
    local tol_us, tol_rem = burst * q + math.floor(tol / count), tol % count
    if count < key[4] or (count == key[4] and burst <= key[5]) then
      key[4], key[5], key[6] = count, burst, tol_us
    end
    local start_us, start_rem = us, rem
    if us < now or (us == now and rem == 0) then start_us, start_rem = now, 0 end
    local pushed = start_rem + cost * r
    local new_us, new_rem = start_us + cost * q + math.floor(pushed / count), pushed % count
    local ahead = new_us - now
    limited[i] = ahead > tol_us or (ahead == tol_us and new_rem > tol_rem)
    if limited[i] and ARGV[5] ~= '3' then  -- an admitted call leaves it empty, not in debt
      new_us, new_rem = now + tol_us, tol_rem
      -- nor forgives a debt a settle's excess left past the tolerance
      if us > new_us or (us == new_us and rem > new_rem) then new_us, new_rem = us, rem end
    end
    local pushes = key[7]
    pushes[#pushes + 1] = {new_us, new_rem, count}
  end
  result[#result + 1] = us
  result[#result + 1] = rem
end

-- what a key is written: `us`, `rem` under its count, kept until it has passed (with an
-- injected clock, an hour or its rule's tolerance at least)
local function write(k, key, us, rem)
  local keep = math.max(us - now + 1, 1)
  if injected then keep = math.max(keep, key[6] + 1, 3600000000) end
  redis.call('SET', KEYS[k], arrival_text(us, rem, key[4]), 'PX', math.ceil(keep / 1000))
end

if tree_limited(limited) then
  -- refused: a bucket read under another count (an override) is held as its rules read
  -- it from now on, so that it drains at their rate
  if ARGV[5] == '1' then
    for k, key in pairs(keys) do
      if key[3] ~= key[4] then
        write(k, key, rescale(key[1], key[2], key[3], key[4]))
      end
    end
  end
  return result
end

result[1] = 1
if ARGV[5] ~= '1' and ARGV[5] ~= '3' then return result end  -- peek or check: nothing recorded
for k, key in pairs(keys) do
  -- the push that holds the most hits, under the key's count; never less than was stored
  local us, rem = rescale(key[1], key[2], key[3], key[4])
  for _, push in ipairs(key[7]) do
    local p_us, p_rem = rescale(push[1], push[2], push[3], key[4])
    if p_us > us or (p_us == us and p_rem > rem) then us, rem = p_us, p_rem end
  end
  write(k, key, us, rem)
end
return result
