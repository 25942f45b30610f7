-- claim: claim a key under a new lease, or report who has it.
--
-- KEYS[1]  the record
-- ARGV[1]  owner: the store's Worker
-- ARGV[2]  attempt: unique per Claim call and the same on go-redis's retries
--          of it, so a retry whose first reply was lost gets its lease back
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  fingerprint
-- Reply:   {'C', token}                              claimed: a new lease
--          {'A', token, pttl}                        claimed before by this same attempt
--          {'D', token, pttl, fingerprint, result}   confirmed
--          {'P', token, pttl, fingerprint, owner}    held by a live claim
--          error 'idem: damaged record'
-- token is a decimal string; pttl the key's remaining milliseconds.

local v = redis.call('GET', KEYS[1])
local floor = 0
if v then
  local r = decode(v)
  if not r then return redis.error_reply(DAMAGED) end
  if r.st == 'C' and r.owner == ARGV[1] and r.attempt == ARGV[2] then
    return {'A', r.toks, redis.call('PTTL', KEYS[1])}
  end
  if r.st ~= 'F' then return reply(KEYS[1], r) end
  -- A forgotten claim: the new token must exceed it even in the same tick.
  floor = r.tok
end
-- The token is the store's clock in microseconds: greater than the token of
-- any lease that expired before now, without a counter key per record.
local t = redis.call('TIME')
local tok = tonumber(t[1]) * 1000000 + tonumber(t[2])
if tok <= floor then tok = floor + 1 end
local toks = string.format('%d', tok)
redis.call('SET', KEYS[1], claimed(toks, ARGV[4], ARGV[1], ARGV[2]), 'PX', ARGV[3])
return {'C', toks}
