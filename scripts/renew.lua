-- renew: extend a live lease.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 2C<token>:<#owner>:<owner>
-- ARGV[2]  the claim's new TTL in milliseconds, from now: the lease plus
--          the keep
-- ARGV[3]  the claim's keep in milliseconds (see record.lua)
-- Reply:   1 renewed; 0 not held by this lease (expired, forgotten,
--          confirmed or taken over); 'X' the record is damaged

local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[1], 1, true) == 1 then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl == -1 or pttl >= tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
  end
  return 0 -- lapsed: a lease that ran out is not brought back
end

-- #include record.lua

return lost(v)
