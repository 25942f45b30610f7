-- lookup: read a key's live record.
--
-- KEYS[1]  the record
-- KEYS[2]  absent; with RedisOptions.FieldHashes, the hash that may keep
--          the key's confirmation as a field (see record.lua)
-- ARGV[1]  'lapsed' to answer a lapsed claim too (an operator's Inspect);
--          absent for Lookup
-- Reply:   false when there is none (a forgotten claim, and without
--          'lapsed' a lapsed one, counts as none)
--          {'L', pttl, {'P', token, lease left (not above 0), fingerprint, owner, n, cp[, ptoken, powner][, ended]}}
--                                                    a lapsed claim, with 'lapsed'
--          {'D', token, pttl, fingerprint, result}   confirmed
--          {'P', token, pttl, fingerprint, owner, n, cp[, ptoken, powner][, ended]}
--                                                    a live claim
--          {'Q', token, pttl, fingerprint, owner, n, cp[, ptoken, powner][, ended]}
--                                                    quarantined
--          'X'                                       the record is damaged
-- See claim.lua for the fields.

-- #include record.lua

local v = redis.call('GET', KEYS[1])
if not v then
  local d, pttl = fieldDone(KEYS[2], KEYS[1])
  if not d then return false end
  if d == DAMAGED then return DAMAGED end
  return reply(decode(d), pttl)
end
local r = decode(v)
if not r then return DAMAGED end
if r.st == 'F' then return false end
local pttl = redis.call('PTTL', KEYS[1])
if r.st == 'C' and not live(r, pttl) then
  if ARGV[1] ~= 'lapsed' then return false end
  return {'L', pttl, reply(r, pttl)}
end
return reply(r, pttl)
