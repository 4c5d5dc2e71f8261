-- settle_log.lua: settle a call on sliding logs, atomically (see ratelimit/core/settling.py).
--
-- KEYS      as sliding_log.lua: one list per identifier, then each one's companion; then,
--           per identifier, its reset mark (keys.py, reset_key): when it was last reset.
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   the tree, as sliding_log.lua reads it.
-- ARGV[3]   per leaf, its key's index in KEYS, or 0 (the rule did not apply).
-- ARGV[4]   per leaf, space-separated: the whole hits to record now (an excess, above 0)
--           or to take back (a refund, below 0); leaves on one list carry the same.
-- ARGV[5]   the reservation's time (us): the hits a refund takes back bear it.
--
-- A refund removes up to that many hits of the reservation's time (LREM: those still
-- held), and nothing when the identifier was reset since the reservation (its mark >=
-- ARGV[5]: hits counted after it, in the same microsecond, bear that time too); an excess
-- records that many now, past the limit (record() in _log.lua, keeping
-- every hit within the list's largest span). Returns {now}.
--
-- Runs after _helpers.lua, _time.lua, _tree.lua and _log.lua, which scripts.py joins in front.

lists = #KEYS / 3  -- record() finds each list's companion after the lists
local delta, keep, ttl = {}, {}, {}
for i = 0, tree[1] - 1 do
  local k = slots[i + 1]
  if k > 0 then
    delta[k] = costs[i + 1]
    keep[k] = math.max(keep[k] or 0, tree[2 + 2 * i])
    ttl[k] = math.max(ttl[k] or 0, tree[3 + 2 * i])
  end
end

for k, d in pairs(delta) do
  if d < 0 then
    local reset = redis.call('GET', KEYS[2 * lists + k])
    if not (reset and tonumber(reset) >= tonumber(ARGV[5])) then
      redis.call('LREM', KEYS[k], -d, ARGV[5])
    end
  elseif d > 0 then
    record(k, d, keep[k], ttl[k], true)
  end
end
return {now}  -- a whole number below 2**53: an exact integer reply
