-- slots.lua: concurrency slots (rl.concurrency): take, renew or give back a slot on every
-- identifier of one claim, atomically.
--
-- KEYS[k]   (k < #KEYS) one sorted set per identifier: its holders' tokens, scored by when
--           their lease ends (microseconds).
-- KEYS[#KEYS] the claim's revocation mark: "revoke" sets it for one lease, and an acquire of
--           the token takes nothing while it lasts (a give-back that overtook its own take).
-- ARGV[1]   now in microseconds, or "" to read the server's TIME.
-- ARGV[2]   "acquire", "renew", "release" or "revoke".
-- ARGV[3]   the holder's token.
-- ARGV[4]   the lease in microseconds.
-- ARGV[5]   per key, space-separated: how many may hold a slot on it at once.
--
-- Returns   {done (1/0), now, held_1, ..., held_n}. acquire: holders whose lease ended are
--           dropped, held_k is how many live holders key k had; a slot is taken on every key
--           when each has one free (done 1), else on none (done 0). renew: every slot the
--           token still holds gets its lease from now; done 0 when one was lost (its lease
--           ended and an acquire dropped it). release: the token's slots are given back;
--           revoke: the same, and the mark is set (an acquire of the token then returns
--           done 0, whatever is free).
--           A key expires when its last lease would end (never sooner than it would).
--
-- Runs after _helpers.lua and _time.lua, which the script engine joins in front of it.

local op, token, lease = ARGV[2], ARGV[3], tonumber(ARGV[4])
local result = {1, now}  -- a whole number below 2**53: an exact integer reply
local n, revoked = #KEYS - 1, KEYS[#KEYS]
local ms = math.ceil(lease / 1000)

if op == 'release' or op == 'revoke' then
  for k = 1, n do redis.call('ZREM', KEYS[k], token) end
  if op == 'revoke' then redis.call('SET', revoked, '1', 'PX', ms) end
  return result
end

local ends = string.format('%.0f', now + lease)
local function keep(key)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

if op == 'renew' then
  for k = 1, n do
    if redis.call('ZSCORE', KEYS[k], token) then
      redis.call('ZADD', KEYS[k], ends, token)
      keep(KEYS[k])
    else
      result[1] = 0
    end
  end
  return result
end

local counts = {}
for c in string.gmatch(ARGV[5], '%d+') do counts[#counts + 1] = tonumber(c) end
local free = redis.call('EXISTS', revoked) == 0
for k = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', string.format('%.0f', now))
  local held = redis.call('ZCARD', KEYS[k])
  result[#result + 1] = held
  if held >= counts[k] then free = false end
end
if not free then
  result[1] = 0
  return result
end
for k = 1, n do
  redis.call('ZADD', KEYS[k], ends, token)
  keep(KEYS[k])
end
return result
