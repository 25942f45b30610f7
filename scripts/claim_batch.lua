-- claim_batch: claim several keys, as claim.lua does each, in one call.
-- Only for keys that may share a script call (a single Redis, not a cluster).
--
-- KEYS      the records
-- ARGV[1]   lease in milliseconds
-- ARGV[1+i] key i's claim value after "1C<token>:" (see claim.lua); each
--           item has an attempt of its own, so a key twice in one batch is
--           two attempts, and a retried batch repeats them
-- Reply:    one claim.lua reply per key, {'X'} for a damaged record

-- #include record.lua

local out = {}
for i = 1, #KEYS do
  out[i] = claim(KEYS[i], ARGV[1], ARGV[1 + i])
end
return out
