-- _now.lua: joined in front of every script by script_engine.py (Redis scripts cannot
-- import). Sets `now`, in microseconds: ARGV[1] when given (an injected clock, or the batch's
-- instant: batch.py), else the server's TIME. Effects replication is asked for first, so
-- that scripts reading TIME may write on Redis versions before 7. Defines `numbers`,
-- `digits` and `cache` (below).

if redis.replicate_commands then redis.replicate_commands() end

-- `numbers(text, pattern)`: the numbers of an argument, parsed once per script call: the
-- batch script (batch.py) drops the `local parsed` line below, so that its calls share
-- one, and a tree sent by every call of a batch is read once. What it returns is never
-- written to.
-- `digits(x)`: a whole number below 2**53 as text, likewise formatted once (Lua's own
-- conversion, %.14g, would round microsecond timestamps; %d prints it exactly, and far
-- cheaper than a float's %.0f).
-- `cache(slot)`: the table of `parsed` kept under `slot`, made on first use.
local parsed = {}  -- batch: shared
-- The three close over `parsed` alone, so a batch's calls share one of each (made by its
-- first call): a closure made per call costs as much as a few table reads.
local helpers = parsed.helpers
if not helpers then
  local function cache(slot)
    local kept = parsed[slot]
    if not kept then
      kept = {}
      parsed[slot] = kept
    end
    return kept
  end
  local function numbers(text, pattern)
    local seen = cache(pattern)
    local got = seen[text]
    if got then return got end
    got = {}
    for n in string.gmatch(text, pattern) do got[#got + 1] = tonumber(n) end
    seen[text] = got
    return got
  end
  local function digits(x)
    local seen = cache(0)
    local text = seen[x]
    if not text then
      text = string.format('%d', x)
      seen[x] = text
    end
    return text
  end
  helpers = {cache, numbers, digits}
  parsed.helpers = helpers
end
local cache, numbers, digits = helpers[1], helpers[2], helpers[3]

-- The time, parsed once per batch: its calls share ARGV[1], and C's strtod on sixteen
-- digits costs more than a table lookup.
local now
-- `injected`: the time came from the caller's clock (a test's), not the server's ('' reads
-- TIME; a batch hands its calls the server's instant marked with a '+': batch.py).
local injected = ARGV[1] ~= '' and string.byte(ARGV[1]) ~= 43
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  local times = cache('time')
  now = times[ARGV[1]]
  if not now then
    now = tonumber(ARGV[1])
    times[ARGV[1]] = now
  end
end
