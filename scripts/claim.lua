-- claim: claim a key under a new lease, or report who has it.
--
-- KEYS[1]  the record
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  the claim's value after "1C<token>:":
--          <#owner>:<owner><#attempt>:<attempt><fingerprint>, where owner is
--          the store's Worker and attempt is unique per Claim call and the
--          same on go-redis's retries of it, so that a retry whose first
--          reply was lost gets its lease back
-- Reply:   token                                     claimed: a new lease (the common case)
--          {'C', token}                              claimed: a new lease, after a forgotten claim
--          {'A', token, pttl}                        claimed before by this same attempt
--          {'D', token, pttl, fingerprint, result}   confirmed
--          {'P', token, pttl, fingerprint, owner}    held by a live claim
--          'X'                                       the record is damaged
-- token is a decimal string; pttl the key's remaining milliseconds.

-- The common case, a new key: the clock and one write, nothing else.
local t = redis.call('TIME')
local toks = t[1] .. string.sub('00000' .. t[2], -6)
if redis.call('SET', KEYS[1], '1C' .. toks .. ':' .. ARGV[2], 'NX', 'PX', ARGV[1]) then return toks end

-- #include record.lua

return claimed(KEYS[1], ARGV[1], ARGV[2], toks)
