-- forget: delete this lease's own live claim, so the key can be claimed again.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 2C<token>:<#owner>:<owner>
-- ARGV[2]  the lease's token
-- ARGV[3]  the claim's keep in milliseconds (see record.lua)
-- Reply:   1 forgotten; 0 nothing of this lease's to forget (never a
--          confirmation, never another holder's claim, nor its own claim
--          once lapsed: that one is left for the next claim's take-over);
--          'X' the record is damaged

local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[1], 1, true) == 1 then
  local pttl = redis.call('PTTL', KEYS[1])
  local keep = tonumber(ARGV[3])
  if pttl == -1 then
    redis.call('SET', KEYS[1], '1F' .. ARGV[2], 'KEEPTTL')
    return 1
  end
  if pttl >= keep then
    -- Keep the token until the lease would have ended (see the record
    -- format). Its take-overs, prior attempt and checkpoint go: the
    -- holder said the work failed, it did not crash.
    redis.call('SET', KEYS[1], '1F' .. ARGV[2], 'PX', math.max(pttl - keep, 1))
    return 1
  end
  return 0
end

-- #include record.lua

return lost(v)
