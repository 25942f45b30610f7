-- renew: extend a live lease.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 1C<token>:<#owner>:<owner>
-- ARGV[2]  lease in milliseconds, from now
-- Reply:   1 renewed; 0 not held by this lease (expired, forgotten,
--          confirmed or taken over); 'X' the record is damaged

local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[1], 1, true) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end

-- #include record.lua

return lost(v)
