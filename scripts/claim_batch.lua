-- claim_batch: claim several keys, as claim.lua does each, in one call.
-- Only for keys that may share a script call (a single Redis, not a cluster).
--
-- KEYS      the records
-- ARGV[1]   owner
-- ARGV[2]   attempt of the batch; key i's attempt is ARGV[2] .. ':' .. i, so
--           a key twice in one batch is two attempts, and a retried batch
--           repeats them
-- ARGV[3]   lease in milliseconds
-- ARGV[3+i] key i's claim value after "1C<token>:" (see claim.lua)
-- Reply:    one claim.lua reply per key, {'X'} for a damaged record

local out = {}
for i = 1, #KEYS do
  out[i] = claim(KEYS[i], ARGV[1], ARGV[2] .. ':' .. i, ARGV[3], ARGV[3 + i])
end
return out
