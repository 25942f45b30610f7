-- The record format and the operations on one record, shared by every
-- script: each includes it where it says "#include record.lua". A one-key
-- script includes it after its fast path, so that the common case runs
-- without defining any of this; a batch script's keys share the cost.
--
-- One Redis string per idempotency key. Its TTL is the lease while claimed
-- and the retention once confirmed. The value begins with the format version
-- '1', then the state:
--
--   1C<token>:<#owner>:<owner><#attempt>:<attempt><fingerprint>   a live claim
--   1D<token>:<#fingerprint>:<fingerprint><result>               a confirmation
--   1F<token>                                                    a forgotten claim
--
-- <token> is a decimal microsecond timestamp of the store's clock (at most
-- 16 digits); <#x> is the decimal byte length of x. The owner comes first in
-- a claim so that "is this my lease?" is one prefix comparison. A forgotten
-- claim is kept for what remained of its lease only so that the next
-- claim's token exceeds it even within the same clock tick; it reads as no
-- record.
--
-- The client builds the parts it knows (redisrecord.go): a claim's tail
-- after "<token>:", a claim's prefix up to its owner, a whole confirmation.
-- Building them in Lua would cost Redis, which every client shares, what
-- costs a client next to nothing.

-- The answers the scripts share, named as redisrecord.go names them. A
-- damaged record is always answered DAMAGED, alone or as a batch's item,
-- and left as it is for an operator to inspect.
local DAMAGED = 'X'
-- confirm's answers (see confirm.lua).
local HELD, LATE, REPEAT, NOT_KEPT = 1, 2, 3, 4

-- decode parses a record, or returns nil when it is not one this version
-- can read (the caller answers DAMAGED and leaves the record alone).
local function decode(v)
  if string.sub(v, 1, 1) ~= '1' then return nil end
  local r = {st = string.sub(v, 2, 2)}
  local pos = 3
  -- num reads decimal digits up to the next ':'.
  local function num()
    -- Past the end there is no field (miniredis's Lua fails on a find that
    -- starts beyond the string instead of returning nil).
    if pos > #v then return nil end
    local e = string.find(v, ':', pos, true)
    if not e then return nil end
    local s = string.sub(v, pos, e - 1)
    if not string.find(s, '^%d+$') then return nil end
    pos = e + 1
    return s
  end
  -- str reads a length-prefixed string.
  local function str()
    local n = num()
    if not n then return nil end
    n = tonumber(n)
    local s = string.sub(v, pos, pos + n - 1)
    if #s ~= n then return nil end
    pos = pos + n
    return s
  end
  if r.st == 'F' then
    r.toks = string.sub(v, 3)
    if not string.find(r.toks, '^%d+$') then return nil end
  else
    r.toks = num()
  end
  -- Digits only, at most 16: tonumber alone accepts 'inf', '1e400' and
  -- '0x10', and a huge floor would make the next token wrap around.
  if not r.toks or #r.toks > 16 then return nil end
  r.tok = tonumber(r.toks)
  if r.st == 'F' then return r end
  if r.st == 'C' then
    r.owner = str()
    r.attempt = str()
    if not r.owner or not r.attempt then return nil end
    r.fp = string.sub(v, pos)
    return r
  end
  if r.st ~= 'D' then return nil end
  r.fp = str()
  if not r.fp then return nil end
  r.result = string.sub(v, pos)
  return r
end

-- reply describes a live record the way Claim and Lookup answer it:
-- {'D', token, pttl, fingerprint, result} or {'P', token, pttl, fingerprint, owner}.
local function reply(key, r)
  local pttl = redis.call('PTTL', key)
  if r.st == 'D' then return {'D', r.toks, pttl, r.fp, r.result} end
  return {'P', r.toks, pttl, r.fp, r.owner}
end

-- claimed answers a claim of key whose SET NX found a record, as claim.lua
-- does; toks is the token the new claim would have had.
local function claimed(key, lease, tail, toks)
  -- The claim's owner and attempt are in its tail.
  local mine = decode('1C0:' .. tail)
  if not mine then return DAMAGED end
  local owner, attempt = mine.owner, mine.attempt
  local v = redis.call('GET', key)
  local floor = 0
  if v then
    local r = decode(v)
    if not r then return DAMAGED end
    if r.st == 'C' and r.owner == owner and r.attempt == attempt then
      return {'A', r.toks, redis.call('PTTL', key)}
    end
    if r.st ~= 'F' then return reply(key, r) end
    floor = r.tok
  end
  -- A forgotten claim: the new token must exceed it even in the same tick.
  if tonumber(toks) <= floor then toks = string.format('%d', floor + 1) end
  redis.call('SET', key, '1C' .. toks .. ':' .. tail, 'PX', lease)
  return {'C', toks}
end

-- confirmed answers a confirm of key whose record v is not the lease's own
-- claim. See confirm.lua for the answers.
local function confirmed(key, v, held, retention, value)
  local toks = string.match(held, '^1C(%d+):')
  if v then
    local r = decode(v)
    if not r then return DAMAGED end
    if r.st == 'D' then
      if r.toks == toks then return REPEAT end
      return NOT_KEPT
    end
  end
  redis.call('SET', key, value, 'PX', retention)
  return LATE
end

-- confirm records key as done. held is how the lease's claim begins, value
-- the whole confirmation. See confirm.lua.
local function confirm(key, held, retention, value)
  local v = redis.call('GET', key)
  if v and string.find(v, held, 1, true) == 1 then
    redis.call('SET', key, value, 'PX', retention)
    return HELD
  end
  return confirmed(key, v, held, retention, value)
end

-- lost answers for a lease whose claim key's record v is not: 0, or DAMAGED.
local function lost(v)
  if v and not decode(v) then return DAMAGED end
  return 0
end
