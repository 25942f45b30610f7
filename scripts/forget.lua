-- forget: delete this lease's own live claim, so the key can be claimed again.
--
-- KEYS[1]  the record
-- ARGV[1]  owner
-- ARGV[2]  token
-- Reply:   1 forgotten; 0 nothing of this lease's to forget (never a
--          confirmation, never another holder's claim);
--          error 'idem: damaged record'

local v = mine(KEYS[1], ARGV[1], ARGV[2])
if v == nil then return redis.error_reply(DAMAGED) end
if not v then return 0 end
-- Keep the token until the lease would have ended (see the record format).
redis.call('SET', KEYS[1], '1F' .. ARGV[2], 'KEEPTTL')
return 1
