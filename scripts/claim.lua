-- claim: claim a key under a new lease, or report who has it.
--
-- KEYS[1]  the record
-- ARGV[1]  owner: the store's Worker
-- ARGV[2]  attempt: unique per Claim call and the same on go-redis's retries
--          of it, so a retry whose first reply was lost gets its lease back
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  the claim's value after "1C<token>:": #owner:owner #attempt:attempt fingerprint
-- Reply:   {'C', token}                              claimed: a new lease
--          {'A', token, pttl}                        claimed before by this same attempt
--          {'D', token, pttl, fingerprint, result}   confirmed
--          {'P', token, pttl, fingerprint, owner}    held by a live claim
--          error 'idem: damaged record'
-- token is a decimal string; pttl the key's remaining milliseconds.

local r = claim(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if r[1] == 'X' then return redis.error_reply(DAMAGED) end
return r
