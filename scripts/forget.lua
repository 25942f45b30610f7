-- forget: delete this lease's own live claim, so the key can be claimed again.
--
-- KEYS[1]  the record
-- ARGV[1]  owner
-- ARGV[2]  token
-- Reply:   1 forgotten; 0 nothing of this lease's to forget (never a
--          confirmation, never another holder's claim);
--          error 'idem: damaged record'

local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local r = decode(v)
if not r then return redis.error_reply(DAMAGED) end
if r.st ~= 'C' or r.owner ~= ARGV[1] or r.toks ~= ARGV[2] then return 0 end
-- Keep the token until the lease would have ended (see record.lua).
redis.call('SET', KEYS[1], '1F' .. r.toks, 'KEEPTTL')
return 1
