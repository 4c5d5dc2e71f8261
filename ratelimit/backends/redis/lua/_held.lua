-- _held.lua: joined after _time.lua in the held variants of the decision scripts (held.py),
-- whose last key, `hold`, is a penalty's hold (penalties.py: its end in us, on the clock
-- decisions read). While it is in force the call is held back: the reply is {-1, the us
-- left}, and nothing else is read or written. Else the script decides as it does alone.

local ends = tonumber(redis.call('GET', hold))
if ends and ends > now then return {-1, ends - now} end
