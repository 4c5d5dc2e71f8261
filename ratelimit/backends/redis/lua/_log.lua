-- _log.lua: the sliding log's reads and writes, for sliding_log.lua, sliding_log_one.lua and
-- settle_log.lua (joined after the prelude and _time.lua, which define `digits` and `now`).
-- `lengths[k]`: the length of list KEYS[k] once read.

local lengths = {}
local lists = #KEYS / 2  -- the lists, then each one's companion (settle_log.lua: then marks)

-- Hits younger than the span among the newest `count` entries of list KEYS[k], and the
-- oldest of them, 0 when none (binary search with LINDEX; the oldest is one it read).
local function window(k, count, threshold)
  local key = KEYS[k]
  lengths[k] = lengths[k] or redis.call('LLEN', key)
  local n = math.min(lengths[k], count)
  if n == 0 then return 0, 0 end
  local last = tonumber(redis.call('LINDEX', key, digits(n - 1)))
  if last > threshold then return n, last end
  local lo, hi, oldest = 0, n - 1, 0
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local stamp = tonumber(redis.call('LINDEX', key, digits(mid)))
    if stamp <= threshold then hi = mid else lo, oldest = mid + 1, stamp end
  end
  return lo, oldest
end

-- The later of two stamps as text: `stamp` (now), or `newest` (the list's newest hit, or
-- false), so that the list stays newest first if the clock stepped back. Stamps are
-- written as `digits` writes them: of one length, the text orders them as their numbers
-- (saving C's strtod, dear on sixteen digits); of two, the numbers are compared.
local function later(newest, stamp)
  if not newest then return stamp end
  if #newest == #stamp then
    if newest > stamp then return newest end
    return stamp
  end
  if tonumber(newest) > tonumber(stamp) then return newest end
  return stamp
end

-- Record `hits` hits now (at the newest hit's time if that is later) on list KEYS[k], whose
-- companion KEYS[lists + k] holds the largest count any limit on it asked to keep; at
-- most that many are pushed (more change no decision). The list is trimmed to that count
-- (its leaves' `count`, or the companion's), or with `keep_inside` to every hit younger
-- than `span` if more (a settle's excess: a later refund must not bring back into view a
-- hit that was cut). It expires after one to two of `span` (never sooner than it already
-- would), as does its companion.
local function record(k, hits, count, span, keep_inside)
  local key, kept = KEYS[k], KEYS[lists + k]
  lengths[k] = lengths[k] or redis.call('LLEN', key)
  local new = lengths[k] == 0  -- a new list: its companion (same TTL) is gone with it
  local held = 0
  local stamp = digits(now)
  if not new then
    held = tonumber(redis.call('GET', kept) or 0)
    stamp = later(redis.call('LINDEX', key, '0'), stamp)
  end
  local most = math.max(count, held)
  local length = lengths[k]
  local left = math.min(hits, most)
  if left == 1 then  -- one hit (most calls): no chunk to build
    length = redis.call('LPUSH', key, stamp)
    left = 0
  end
  while left > 0 do  -- in chunks, under Lua's limit on unpack()
    local chunk = {}
    for n = 1, math.min(left, 1000) do chunk[n] = stamp end
    length = redis.call('LPUSH', key, unpack(chunk))
    left = left - #chunk
  end
  lengths[k] = length
  local limit = most
  if keep_inside then limit = math.max(most, (window(k, length, now - span))) end
  if length > limit then
    redis.call('LTRIM', key, 0, limit - 1)
    lengths[k] = limit
  end
  -- Kept for at least the largest span: once its time to live falls below that, it gets
  -- two spans, so that most calls only read it (one PTTL instead of a PEXPIRE per call).
  local ms = math.ceil(span / 1000)
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

-- One rule of `count` hits per `span` on list KEYS[k], for a call of `cost` (most limits:
-- sliding_log.lua's tree of one leaf, and all of sliding_log_one.lua): decided, and
-- recorded when admitted unless ARGV[5] is "0". Returns the scripts' reply for it.
local function decide_one(k, count, span, cost)
  local depth = count - cost + 1
  local hits, oldest = window(k, depth, now - span)
  if hits >= depth then return {0, now, hits, oldest} end
  if ARGV[5] ~= '0' then record(k, cost, count, span, false) end
  return {1, now, hits, oldest}
end
