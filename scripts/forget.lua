-- forget: delete this lease's own live claim, so the key can be claimed again.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 1C<token>:<#owner>:<owner>
-- ARGV[2]  the lease's token
-- Reply:   1 forgotten; 0 nothing of this lease's to forget (never a
--          confirmation, never another holder's claim);
--          'X' the record is damaged

local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[1], 1, true) == 1 then
  -- Keep the token until the lease would have ended (see the record format).
  redis.call('SET', KEYS[1], '1F' .. ARGV[2], 'KEEPTTL')
  return 1
end

-- #include record.lua

return lost(v)
