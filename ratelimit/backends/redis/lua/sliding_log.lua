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
-- ARGV[5]   "1" to record an allowed call, "0" to only decide (peek), "2" to check at
--           exactly ARGV[1] (spanning.py: a held part read back; nothing recorded).
--
-- Returns   {allowed (1/0), now, hits_1, oldest_1, ..., hits_L, oldest_L}: per leaf, with
--           depth = count - cost + 1, the hits in its window among the newest `depth` and
--           the oldest of them (0 when none; when all `depth` are inside, the depth-th
--           newest timestamp, which says when the call would pass). When allowed, every
--           list got `cost` hits, was trimmed to the largest count any limit on it asked to
--           keep (its leaves here, or the count its companion holds: two limits, or two
--           deployments, on one list never cut each other's history; where a leaf on it was
--           limited, to every hit within its largest span if more), and expires after
--           one to two of the largest span on it (never sooner than it already would), as
--           does its companion.
--
-- Runs after _helpers.lua, _time.lua, _tree.lua and _log.lua, which scripts.py joins in front.

local leaves = tree[1]

-- One rule (most limits): what the loop below does for it, without its tables.
if leaves == 1 and slots[1] > 0 then
  local k, count, span = slots[1], tree[2], tree[3]
  local cost = cost_of(k)
--@ _log_one.lua
end

local limited = {}
local result = {0, now}
local keep, ttl, over = {}, {}, {}

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
    over[k] = over[k] or limited[i]
  else
    limited[i] = false
  end
  result[#result + 1] = hits
  result[#result + 1] = oldest
end

if tree_limited(limited) then return result end

result[1] = 1
if ARGV[5] ~= '1' then return result end  -- peek or check: decided, nothing recorded
-- A rule over its count on a list (an And admitted through another rule): every hit within
-- its span is kept, so that a settle's refund never brings a cut hit's place into view.
for k, count in pairs(keep) do record(k, cost_of(k), count, ttl[k], over[k]) end
return result
