-- forget: delete this lease's own live claim, so the key can be claimed again.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 1C<token>:<#owner>:<owner>
-- ARGV[2]  the lease's token
-- Reply:   1 forgotten; 0 nothing of this lease's to forget (never a
--          confirmation, never another holder's claim);
--          error 'idem: damaged record'

local m = mine(KEYS[1], ARGV[1])
if m == nil then return redis.error_reply(DAMAGED) end
if not m then return 0 end
-- Keep the token until the lease would have ended (see the record format).
redis.call('SET', KEYS[1], '1F' .. ARGV[2], 'KEEPTTL')
return 1
