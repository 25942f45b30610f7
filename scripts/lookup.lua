-- lookup: read a key's live record.
--
-- KEYS[1]  the record
-- Reply:   false when there is none (a forgotten claim counts as none)
--          {'D', token, pttl, fingerprint, result}   confirmed
--          {'P', token, pttl, fingerprint, owner}    a live claim
--          'X'                                      the record is damaged

-- #include record.lua

local v = redis.call('GET', KEYS[1])
if not v then return false end
local r = decode(v)
if not r then return DAMAGED end
if r.st == 'F' then return false end
return reply(KEYS[1], r)
