-- _tree.lua: joined after _helpers.lua and _time.lua in front of the scripts that decide
-- a rule tree.
-- Reads ARGV[2] (the tree: L, per leaf count and span or size in microseconds, then the
-- prefix program) into `tree`, ARGV[3] (per leaf, its key index or 0) into `slots` and
-- ARGV[4] (the call's cost: one number counted on every key, or one per key k of the
-- script's counting keys, space-separated) into `costs`; defines `cost_of(k)`, what the
-- call counts on key k, and `tree_limited(limited)`: whether the tree is limited, given
-- per leaf (from 0) whether that rule is limited. Opcodes: 0 = leaf, 1 = And, 2 = Or.

local tree = numbers(ARGV[2], '%d+')
local slots = numbers(ARGV[3], '%d+')
local costs = numbers(ARGV[4], '%S+')

local function cost_of(k)
  return costs[k] or costs[1]
end

local function tree_limited(limited)
  if tree[1] == 1 then return limited[0] end  -- any tree of one leaf is that leaf
  local pos = 2 + 2 * tree[1]
  local function node()
    local op, operand = tree[pos], tree[pos + 1]
    pos = pos + 2
    if op == 0 then return limited[operand] end
    local all, any = true, false
    for _ = 1, operand do
      local child = node()
      all = all and child
      any = any or child
    end
    if op == 1 then return all end
    return any
  end
  return node()
end
