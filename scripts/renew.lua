-- renew: extend a live lease.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 1C<token>:<#owner>:<owner>
-- ARGV[2]  lease in milliseconds, from now
-- Reply:   1 renewed; 0 not held by this lease (expired, forgotten,
--          confirmed or taken over); error 'idem: damaged record'

local m = mine(KEYS[1], ARGV[1])
if m == nil then return redis.error_reply(DAMAGED) end
if not m then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
