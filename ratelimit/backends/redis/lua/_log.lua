-- _log.lua: the sliding log's reads and writes as functions, for sliding_log.lua and
-- settle_log.lua (joined after _helpers.lua, _time.lua and _tree.lua), their bodies the
-- blocks that sliding_log_one.lua joins inline. `lengths[k]`: the length of list KEYS[k]
-- once read.

local lengths = {}
local lists = #KEYS / 2  -- the lists, then each one's companion (settle_log.lua: then marks)

-- Hits younger than `threshold` among the newest `depth` entries of list KEYS[k], and the
-- oldest of them, 0 when none.
local function window(k, depth, threshold)
  local hits, oldest = 0, 0
--@ _log_window.lua
  return hits, oldest
end

-- Record `cost` hits now on list KEYS[k] (_log_push.lua), then trim it to `count` or the
-- count its companion holds (_log_keep.lua), or with `keep_inside` to every hit younger than
-- `span` if more (a settle's excess: a later refund must not bring back into view a hit
-- that was cut); it expires after one to two of `span` (never sooner than it already
-- would), as does its companion.
local function record(k, cost, count, span, keep_inside)
--@ _log_push.lua
  local limit = most
  if keep_inside then limit = math.max(most, (window(k, length, now - span))) end
--@ _log_keep.lua
end
