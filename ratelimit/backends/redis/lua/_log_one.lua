-- _log_one.lua: a block, joined where a script names it: one rule of `count` hits per
-- `span` on list KEYS[k] for a call of `cost` (most limits: sliding_log.lua's tree of one
-- leaf, and all of sliding_log_one.lua) decided, recorded when admitted if ARGV[5] is
-- "1", and answered with the scripts' reply. Inline, not a function: a lone call of one
-- rule makes no closure.
local depth = count - cost + 1
local threshold = now - span
local hits, oldest = 0, 0
--@ _log_window.lua
if hits >= depth then return {0, now, hits, oldest} end
if ARGV[5] == '1' then
--@ _log_push.lua
  local limit = most
--@ _log_keep.lua
end
return {1, now, hits, oldest}
