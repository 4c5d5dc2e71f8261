-- sliding_log_one.lua: sliding_log.lua for a tree of one rule whose selector resolved (most
-- limits), on its own: no tree to parse, no helpers to make. A lone call of the general
-- script spends about half its time on Redis there (measured: 12.6 µs against 7 for a
-- steady user). Same KEYS, ARGV and return value as sliding_log.lua, whose one-rule branch
-- it must match step for step (same commands, same stored state, same reply; held
-- together by tests/test_sliding_log_one.py); scripts.py sends it where ARGV[2] is
-- "1 count span 0 0" and ARGV[3] is "1".
--
-- KEYS[1]   the list (hit timestamps in microseconds, newest first); KEYS[2] its companion.
-- ARGV[1]   now in microseconds ('+' first from a batch), or "" to read the server's TIME.
-- ARGV[2]   "1 count span_us 0 0";  ARGV[3] "1";  ARGV[4] the cost;  ARGV[5] "1" to record.
-- Returns   {allowed (1/0), now, hits, oldest}, as sliding_log.lua.

if redis.replicate_commands then redis.replicate_commands() end

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local _, _, count, span = string.find(ARGV[2], '^1 (%d+) (%d+)')
count, span = tonumber(count), tonumber(span)
local cost = tonumber(ARGV[4])
local key, kept = KEYS[1], KEYS[2]

-- _log.lua's window(1, depth, now - span)
local depth = count - cost + 1
local threshold = now - span
local length = redis.call('LLEN', key)
local hits, oldest = math.min(length, depth), 0
if hits ~= 0 then
  local last = tonumber(redis.call('LINDEX', key, string.format('%d', hits - 1)))
  if last > threshold then
    oldest = last
  else
    local lo, hi = 0, hits - 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local stamp = tonumber(redis.call('LINDEX', key, string.format('%d', mid)))
      if stamp <= threshold then hi = mid else lo, oldest = mid + 1, stamp end
    end
    hits = lo
  end
end
if hits >= depth then return {0, now, hits, oldest} end
if ARGV[5] == '0' then return {1, now, hits, oldest} end

-- _log.lua's record(1, cost, count, span, false)
local new = length == 0
local held = 0
local stamp = string.format('%d', now)
if not new then
  held = tonumber(redis.call('GET', kept) or 0)
  local newest = redis.call('LINDEX', key, '0')
  if newest then  -- _log.lua's later(newest, stamp)
    if #newest == #stamp then
      if newest > stamp then stamp = newest end
    elseif tonumber(newest) > tonumber(stamp) then
      stamp = newest
    end
  end
end
local most = math.max(count, held)
local left = math.min(cost, most)
if left == 1 then
  length = redis.call('LPUSH', key, stamp)
  left = 0
end
while left > 0 do
  local chunk = {}
  for n = 1, math.min(left, 1000) do chunk[n] = stamp end
  length = redis.call('LPUSH', key, unpack(chunk))
  left = left - #chunk
end
if length > most then redis.call('LTRIM', key, 0, most - 1) end
local ms = math.ceil(span / 1000)
local pttl = -1
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
return {1, now, hits, oldest}
