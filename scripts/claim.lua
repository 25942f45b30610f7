-- claim: claim a key under a new lease, or report who has it.
--
-- KEYS[1]  the record
-- KEYS[2]  absent; with RedisOptions.FieldHashes, the hash that may keep
--          the key's confirmation as a field (see record.lua)
-- ARGV[1]  the claim's TTL in milliseconds: the lease, plus the keep that
--          remembers a lapsed claim (see record.lua)
-- ARGV[2]  the store's MaxTakeOvers
-- ARGV[3]  the claim's value after "2C<token>:":
--          <#owner>:<owner><#attempt>:<attempt><keep>:0:0:<fingerprint>,
--          where owner is the store's Worker and attempt is unique per
--          Claim call and the same on go-redis's retries of it, so that a
--          retry whose first reply was lost gets its lease back
-- Reply:   token                                     claimed: a new lease (the common case)
--          {'C', token}                              claimed: a new lease, after a forgotten claim
--          {'T', token, n, cp, ptoken, powner[, ended]}
--                                                    claimed: the take-over of a lapsed claim,
--                                                    the n-th in a row, of ptoken's attempt
--                                                    (ended: why its holder gave it up)
--          {'A', token, pttl}                        claimed before by this same attempt
--          {'D', token, pttl, fingerprint, result}   confirmed
--          {'P', token, pttl, fingerprint, owner, n, cp[, ptoken, powner][, ended]}
--                                                    held by a live claim
--          {'Q', token, pttl, fingerprint, owner, n, cp[, ptoken, powner][, ended]}
--                                                    quarantined (the last attempt's)
--          'X'                                       the record is damaged
-- token is a decimal string; pttl the milliseconds left of the lease or
-- record; n the take-overs in a row; cp the last checkpoint.

-- The common case, a new key: the clock and one write, nothing else. The
-- write answers what was there instead (NX with GET): a duplicate costs
-- no read of its own.
local t = redis.call('TIME')
local toks = t[1] .. string.sub('00000' .. t[2], -6)
if KEYS[2] then
  -- A confirmation kept as a field: the one duplicate found before the
  -- write (see record.lua's field form).
  local f = string.match(KEYS[1], '{(.*)}$')
  local d = redis.call('HGET', KEYS[2], f)
  if d then
    -- A field holds a token of 16 digits, or it is damaged.
    if #d ~= 16 or not string.find(d, '^[1-9]%d+$') then return 'X' end
    return {'D', d, redis.call('HPTTL', KEYS[2], 'FIELDS', 1, f)[1], '', ''}
  end
end
local v = redis.call('SET', KEYS[1], '2C' .. toks .. ':' .. ARGV[3], 'NX', 'GET', 'PX', ARGV[1])
if not v then return toks end

-- #include record.lua

return claimed(KEYS[1], ARGV[1], ARGV[3], toks, ARGV[2], v)
