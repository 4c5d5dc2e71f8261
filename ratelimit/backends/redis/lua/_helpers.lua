-- _helpers.lua: joined in front of every script but the one-rule ones (which start with
-- _one.lua), then _time.lua (Redis scripts cannot import: scripts.py joins the parts).
-- Effects replication is asked for first, so that scripts reading TIME may write on Redis
-- versions before 7. Defines `numbers`, `digits` and `cache` (below), and `times`, where
-- _time.lua keeps ARGV[1] parsed: once per batch (C's strtod on sixteen digits costs more
-- than a table lookup).

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

local times = ARGV[1] ~= '' and cache('time')  -- none made where the time is read: TIME
