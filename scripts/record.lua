-- The record format, shared by every script (prepended to each one).
--
-- One Redis string per idempotency key. Its TTL is the lease while claimed
-- and the retention once confirmed. The value begins with the format version
-- '1', then the state:
--
--   1C<token>:<#fp>:<#owner>:<#attempt>:<fp><owner><attempt>   a live claim
--   1D<token>:<#fp>:<fp><result>                               a confirmation
--   1F<token>                                                  a forgotten claim
--
-- <token> is a decimal microsecond timestamp of the store's clock; <#x> is
-- the decimal byte length of x. A forgotten claim is kept for what remained
-- of its lease only so that the next claim's token exceeds it even within
-- the same clock tick; it reads as no record.

local DAMAGED = 'idem: damaged record'

-- decode parses a record, or returns nil when it is not one this version
-- can read (the caller answers DAMAGED and leaves the record alone).
local function decode(v)
  if string.sub(v, 1, 1) ~= '1' then return nil end
  local r = {st = string.sub(v, 2, 2)}
  if r.st == 'F' then
    -- Decimal digits only, at most 16 (microseconds until the year 2286):
    -- tonumber alone accepts 'inf', '1e400' and '0x10', and a huge floor
    -- would make the next token wrap around.
    r.toks = string.sub(v, 3)
    if not string.find(r.toks, '^%d+$') or #r.toks > 16 then return nil end
    r.tok = tonumber(r.toks)
    return r
  end
  local pos = 3
  local function field()
    -- Past the end there is no field (miniredis's Lua fails on a find that
    -- starts beyond the string instead of returning nil).
    if pos > #v then return nil end
    local e = string.find(v, ':', pos, true)
    if not e then return nil end
    local s = string.sub(v, pos, e - 1)
    pos = e + 1
    if not string.find(s, '^%d+$') then return nil end
    return s
  end
  r.toks = field()
  local fpl = tonumber(field())
  if not r.toks or not fpl then return nil end
  r.tok = tonumber(r.toks)
  if r.st == 'D' then
    if #v < pos - 1 + fpl then return nil end
    r.fp = string.sub(v, pos, pos + fpl - 1)
    r.result = string.sub(v, pos + fpl)
    return r
  end
  if r.st ~= 'C' then return nil end
  local ol, al = tonumber(field()), tonumber(field())
  if not ol or not al or #v ~= pos - 1 + fpl + ol + al then return nil end
  r.fp = string.sub(v, pos, pos + fpl - 1)
  pos = pos + fpl
  r.owner = string.sub(v, pos, pos + ol - 1)
  r.attempt = string.sub(v, pos + ol)
  return r
end

local function claimed(toks, fp, owner, attempt)
  return '1C' .. toks .. ':' .. #fp .. ':' .. #owner .. ':' .. #attempt .. ':' .. fp .. owner .. attempt
end

local function done(toks, fp, result)
  return '1D' .. toks .. ':' .. #fp .. ':' .. fp .. result
end

-- reply describes a live record the way Claim and Lookup answer it.
local function reply(key, r)
  local pttl = redis.call('PTTL', key)
  if r.st == 'D' then return {'D', r.toks, pttl, r.fp, r.result} end
  return {'P', r.toks, pttl, r.fp, r.owner}
end

