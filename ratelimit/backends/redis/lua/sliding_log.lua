-- sliding_log.lua: decide a whole rule tree on sliding logs and record the hit, atomically.
--
-- KEYS[k]   for k = 1..n, one list per identifier: hit timestamps in microseconds, newest
--           first; then KEYS[n + k], its companion string: the largest count any limit
--           that admitted a call on that list asked to keep (it lives as long as the list).
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the tree, space-separated numbers: L (the number of leaves), then per leaf its
--           count and span in microseconds, then the tree as a prefix program of
--           (opcode, operand) pairs: 0 = leaf (operand: leaf index from 0), 1 = And,
--           2 = Or (operand: number of children).
-- ARGV[3]   per leaf, space-separated: the index k of its key in KEYS, or 0 when its
--           selector did not resolve (the rule is then never limited, records nothing).
-- ARGV[4]   the call's cost: how many hits it records (at most every leaf's count), on
--           every list; or one cost per list, space-separated, in the order of KEYS.
-- ARGV[5]   "1" to record an allowed call, "0" to only decide (peek).
--
-- Returns   {allowed (1/0), now, hits_1, oldest_1, ..., hits_L, oldest_L}: per leaf, with
--           depth = count - cost + 1, the hits in its window among the newest `depth` and
--           the oldest of them (0 when none; when all `depth` are inside, the depth-th
--           newest timestamp, which says when the call would pass). When allowed, every
--           list got `cost` hits, was trimmed to the largest count any limit on it asked to
--           keep (its leaves here, or the count its companion holds: two limits, or two
--           deployments, on one list never cut each other's history), and expires after
--           one to two of the largest span on it (never sooner than it already would), as
--           does its companion.
--
-- Runs after _now.lua and _tree.lua, which script_engine.py joins in front of it.

local leaves = tree[1]
local limited = {}
local result = {0, now}
local keep, ttl, lengths = {}, {}, {}

-- Hits younger than the span among the newest `count` entries of list KEYS[k], and the
-- oldest of them, 0 when none (binary search with LINDEX; the oldest is one it read).
local function window(k, count, threshold)
  local key = KEYS[k]
  lengths[k] = lengths[k] or redis.call('LLEN', key)
  local n = math.min(lengths[k], count)
  if n == 0 then return 0, 0 end
  local last = tonumber(redis.call('LINDEX', key, n - 1))
  if last > threshold then return n, last end
  local lo, hi, oldest = 0, n - 1, 0
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local stamp = tonumber(redis.call('LINDEX', key, mid))
    if stamp <= threshold then hi = mid else lo, oldest = mid + 1, stamp end
  end
  return lo, oldest
end

for i = 0, leaves - 1 do
  local k = slots[i + 1]
  local count = tree[2 + 2 * i]
  local span = tree[3 + 2 * i]
  local hits, oldest = 0, 0
  if k > 0 then
    local depth = count - cost_of(k) + 1
    hits, oldest = window(k, depth, now - span)
    keep[k] = math.max(keep[k] or 0, count)
    ttl[k] = math.max(ttl[k] or 0, span)
    limited[i] = hits >= depth
  else
    limited[i] = false
  end
  result[#result + 1] = hits
  result[#result + 1] = oldest
end

if tree_limited(limited) then return result end

result[1] = 1
if ARGV[5] == '0' then return result end  -- peek: decided, nothing recorded
local lists = #KEYS / 2
for k, count in pairs(keep) do
  local key, kept = KEYS[k], KEYS[lists + k]
  local new = lengths[k] == 0  -- a new list: its companion (same TTL) is gone with it
  local held, newest = 0, 0
  if not new then
    held = tonumber(redis.call('GET', kept) or 0)
    newest = tonumber(redis.call('LINDEX', key, 0))
  end
  -- '%.0f': Lua's default number format (%.14g) would round microsecond timestamps.
  local stamp = string.format('%.0f', math.max(now, newest))
  local length = 0
  local left = math.min(cost_of(k), count)
  while left > 0 do  -- in chunks, under Lua's limit on unpack()
    local chunk = {}
    for n = 1, math.min(left, 1000) do chunk[n] = stamp end
    length = redis.call('LPUSH', key, unpack(chunk))
    left = left - #chunk
  end
  if length > math.max(count, held) then redis.call('LTRIM', key, 0, math.max(count, held) - 1) end
  -- Kept for at least the largest span: once its time to live falls below that, it gets
  -- two spans, so that most calls only read it (one PTTL instead of a PEXPIRE per call).
  local ms = math.ceil(ttl[k] / 1000)
  local pttl = -1  -- a new list has no TTL yet
  if not new then pttl = redis.call('PTTL', key) end
  local extended = pttl < ms
  if extended then
    pttl = 2 * ms
    redis.call('PEXPIRE', key, pttl)
  end
  if count > held then
    redis.call('SET', kept, count, 'PX', pttl)
  elseif extended then
    redis.call('PEXPIRE', kept, pttl)
  end
end
return result
