-- _log_window.lua: a block, joined where a script names it (`--@ _log_window.lua`): into
-- `hits` the hits younger than `threshold` among the newest `depth` entries of list KEYS[k],
-- and into `oldest` the oldest of them (both stay 0, as the includer set them, when none:
-- a binary search with LINDEX; the oldest is one it read). `lengths[k]`: the list's length
-- once read.
do
  local key = KEYS[k]
  local length = lengths[k] or redis.call('LLEN', key)
  lengths[k] = length
  local n = math.min(length, depth)
  if n ~= 0 then
    local last = tonumber(redis.call('LINDEX', key, digits(n - 1)))
    if last > threshold then
      hits, oldest = n, last
    else
      local lo, hi = 0, n - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local stamp = tonumber(redis.call('LINDEX', key, digits(mid)))
        if stamp <= threshold then hi = mid else lo, oldest = mid + 1, stamp end
      end
      hits = lo
    end
  end
end
