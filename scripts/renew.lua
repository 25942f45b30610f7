-- renew: extend a live lease.
--
-- KEYS[1]  the record
-- ARGV[1]  owner
-- ARGV[2]  token
-- ARGV[3]  lease in milliseconds, from now
-- Reply:   1 renewed; 0 not held by this lease (expired, forgotten,
--          confirmed or taken over); error 'idem: damaged record'

local v = mine(KEYS[1], ARGV[1], ARGV[2])
if v == nil then return redis.error_reply(DAMAGED) end
if not v then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
