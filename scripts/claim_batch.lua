-- claim_batch: claim several keys, as claim.lua does each, in order, in one
-- call. Only for keys that may share a script call (a single Redis, not a
-- cluster).
--
-- KEYS      the records; with RedisOptions.FieldHashes, followed by each
--           one's field hash (claim.lua's KEYS[2]), in the same order
-- ARGV[1]   the claims' TTL in milliseconds (lease plus keep)
-- ARGV[2]   the store's MaxTakeOvers
-- ARGV[2+i] key i's claim value after "2C<token>:" (see claim.lua); each
--           item has an attempt of its own, so a key twice in one batch is
--           two attempts, and a retried batch repeats them
-- Reply:    one claim.lua reply per key ('X' for a damaged record)

-- One clock reading serves every key: a script runs alone, so no lease can
-- expire between its first key and its last, and a token only has to
-- exceed those of leases that expired before now.
local t = redis.call('TIME')
local toks = t[1] .. string.sub('00000' .. t[2], -6)

-- #include record.lua

local out = {}
local n = #ARGV - 2
for i = 1, n do
  local tail = ARGV[2 + i]
  local d, pttl = fieldDone(KEYS[n + i], KEYS[i])
  if d == DAMAGED then
    out[i] = DAMAGED
  elseif d then
    out[i] = {'D', d, pttl, '', ''}
  else
    local v = redis.call('SET', KEYS[i], '2C' .. toks .. ':' .. tail, 'NX', 'GET', 'PX', ARGV[1])
    if not v then
      out[i] = toks
    else
      out[i] = claimed(KEYS[i], ARGV[1], tail, toks, ARGV[2], v)
    end
  end
end
return out
