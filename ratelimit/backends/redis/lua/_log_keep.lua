-- _log_keep.lua: a block, joined after _log_push.lua where a script names it: trim the list
-- to `limit` entries, and keep it (and its companion) for at least `span`: once its time to
-- live falls below that, it gets two spans, so that most calls only read it (one PTTL
-- instead of a PEXPIRE per call); the companion is set to `count` when that is more than it
-- held.
if length > limit then
  redis.call('LTRIM', key, 0, limit - 1)
  lengths[k] = limit
end
local ms = math.ceil(span / 1000)
local pttl = -1  -- a new list has no time to live yet
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
