-- The record format and the operations on one record, shared by every
-- script: each includes it where it says "#include record.lua". A one-key
-- script includes it after its fast path, so that the common case runs
-- without defining any of this; a batch script's keys share the cost.
--
-- One Redis string per idempotency key. The value begins with the format
-- version, then the state:
--
--   2C<token>:<#owner>:<owner><#attempt>:<attempt><keep>:<n>:<prior><#cp>:<cp><fingerprint>
--                                                              a claim, live or lapsed
--   2Q<the same fields>                                        a quarantined key
--   1D<token>:<#fingerprint>:<fingerprint><result>             a confirmation
--   <token>                                                    a confirmation without
--                                                              fingerprint or result,
--                                                              when token has 16 digits
--   2R<the same fields as 1D>                                  an operator's confirmation
--   1F<token>                                                  a forgotten claim
--
-- <token> is a decimal microsecond timestamp of the store's clock (at most
-- 16 digits); <#x> is the decimal byte length of x. The owner comes first in
-- a claim so that "is this my lease?" is one prefix comparison.
--
-- A claim's key lives <keep> milliseconds (its store's Retention) past its
-- lease: its TTL is the lease plus keep, so the lease is live while the
-- PTTL is at least keep (through its last millisecond, as Redis keeps a
-- key through its own), and a lapsed claim is still there for the next claim,
-- which takes it over and is told so. <n> counts the take-overs in a row
-- that led to this claim; when n > 0, <prior> is the attempt taken over,
-- <token>:<#owner>:<owner> (its time is its token), else empty. <cp> is the
-- last checkpoint, carried from holder to holder. A lapsed claim with n at
-- the store's MaxTakeOvers becomes a quarantined key (2Q), living for the
-- Retention of the store that quarantined it, answered to every claim until
-- an operator settles it (resolve.lua) or a late confirm records over it.
-- A claim's <attempt> names the Claim call that made it (a retry of that
-- call gets its lease back) until its holder gives the key up unfinished
-- and says why (Abandon): then it is ENDED followed by the reason, which
-- no attempt name begins with (they are hex). The next claim is told the
-- reason with the attempt it takes over; a quarantined key keeps it. A
-- client of an earlier version reads the field as an attempt like any
-- other.
-- Version 1 claims (1C<token>:<#owner>:<owner><#attempt>:<attempt><fingerprint>,
-- a TTL of the lease alone) are still read: keep 0, no take-overs.
--
-- An operator's confirmation (resolve.lua) is a confirmation in all but its
-- mark: its result is the plain one the front door documents, not the front
-- door's own record (Record.Resolved), and it is answered 'R' where a
-- confirmation is answered 'D'. A version of its own, so that a client of
-- an earlier version, which cannot tell it apart, calls it damaged instead
-- of replaying it as what it is not.
--
-- A forgotten claim is kept for what remained of its lease only so that the
-- next claim's token exceeds it even within the same clock tick; it reads as
-- no record.
--
-- The client builds the parts it knows (redisrecord.go): a new claim's tail
-- after "2C<token>:", a claim's prefix up to its owner, a whole confirmation.
-- Building them in Lua would cost Redis, which every client shares, what
-- costs a client next to nothing.

-- The answers the scripts share, named as redisrecord.go names them. A
-- damaged record is always answered DAMAGED, alone or as a batch's item,
-- and left as it is for an operator to inspect.
local DAMAGED = 'X'
-- What a claim's attempt field begins with once its holder said why it
-- gives the key up.
local ENDED = '!'
-- confirm's answers (see confirm.lua).
local HELD, LATE, REPEAT, NOT_KEPT = 1, 2, 3, 4

-- The field form (RedisOptions.FieldHashes): a short confirmation may be
-- kept as a field of a hash, with a TTL of its own, instead of as its key.
-- The client names the hash (h, a key of the record key's hash slot) in
-- every script that may read or write one, as a key (a script must name
-- every key it touches, or a resharding could move one under it: a read
-- of a hash already moved would find nothing); the field is the record key's
-- escaped user key, between its braces. A record is in one place at a
-- time: a confirmation written as a field deletes the key, and a claim
-- looks at the field before it creates the key.
local function field(key) return string.match(key, '{(.*)}$') end

-- fieldDone returns the confirmation kept as key's field of hash h and
-- its TTL, nil when there is none, or DAMAGED when the field holds
-- anything but a short confirmation (a token of 16 digits), the one value
-- a field is written with.
local function fieldDone(h, key)
  if not h then return nil end
  local f = field(key)
  local v = redis.call('HGET', h, f)
  if not v then return nil end
  if #v ~= 16 or not string.find(v, '^[1-9]%d+$') then return DAMAGED end
  return v, redis.call('HPTTL', h, 'FIELDS', 1, f)[1]
end

-- keepDone writes confirmation value of key for retention milliseconds:
-- as a field of h when h is given, value is a short confirmation and the
-- field short enough for the hash's compact encoding (64 bytes, Redis's
-- hash-max-listpack-value) and the server has HSETEX (Redis 8.0, Valkey
-- 9.0); else as the key.
local function keepDone(key, h, value, retention)
  if h and #value == 16 then
    local f = field(key)
    -- pcall: a server without HSETEX answers an error, and keeps the key.
    if #f <= 64 and redis.pcall('HSETEX', h, 'PX', retention, 'FIELDS', 1, f, value) == 1 then
      redis.call('DEL', key)
      return
    end
  end
  redis.call('SET', key, value, 'PX', retention)
end

-- decode parses a record, or returns nil when it is not one this version
-- can read (the caller answers DAMAGED and leaves the record alone).
local function decode(v)
  -- The short confirmation: a token of 16 digits, as the store's clock
  -- writes them (microseconds since 2001), and nothing else. No other form
  -- has a digit second.
  if #v == 16 and string.find(v, '^[1-9]%d+$') then
    return {st = 'D', keep = 0, n = 0, cp = '', toks = v, tok = tonumber(v), fp = '', result = ''}
  end
  local ver = string.sub(v, 1, 1)
  if ver ~= '1' and ver ~= '2' then return nil end
  local r = {st = string.sub(v, 2, 2), keep = 0, n = 0, cp = ''}
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
  -- tok reads a token: digits only, at most 16. tonumber alone accepts
  -- 'inf', '1e400' and '0x10', and a huge floor would make the next
  -- token wrap around.
  local function tok()
    local s = num()
    if not s or #s > 16 then return nil end
    return s
  end
  if ver == '1' and r.st == 'F' then
    r.toks = string.sub(v, 3)
    if not string.find(r.toks, '^%d+$') or #r.toks > 16 then return nil end
    r.tok = tonumber(r.toks)
    return r
  end
  r.toks = tok()
  if not r.toks then return nil end
  r.tok = tonumber(r.toks)
  if ver == '2' and r.st == 'R' then
    -- An operator's confirmation: a confirmation, marked.
    r.st, r.op = 'D', true
    r.fp = str()
    if not r.fp then return nil end
    r.result = string.sub(v, pos)
    return r
  end
  if ver == '2' then
    if r.st ~= 'C' and r.st ~= 'Q' then return nil end
    r.owner = str()
    r.attempt = str()
    local keep, n = num(), num()
    if not r.owner or not r.attempt or not keep or not n or #keep > 12 or #n > 9 then return nil end
    r.keep, r.n = tonumber(keep), tonumber(n)
    if r.n > 0 then
      r.ptoks = tok()
      r.powner = str()
      if not r.ptoks or not r.powner then return nil end
    end
    r.cp = str()
    if not r.cp then return nil end
    r.fp = string.sub(v, pos)
    return r
  end
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

-- encode writes a claim or a quarantined key (r.st 'C' or 'Q') in the
-- current format.
local function encode(r)
  local prior = ''
  if r.n > 0 then prior = r.ptoks .. ':' .. #r.powner .. ':' .. r.powner end
  return '2' .. r.st .. r.toks .. ':' .. #r.owner .. ':' .. r.owner .. #r.attempt .. ':' .. r.attempt ..
    string.format('%d:%d:', r.keep, r.n) .. prior .. #r.cp .. ':' .. r.cp .. r.fp
end

-- live reports whether claim r, whose key has pttl milliseconds left, is
-- within its lease. A key without a TTL (-1) was persisted by someone
-- else: it never expires.
local function live(r, pttl)
  return pttl == -1 or pttl >= r.keep
end

-- ended returns why claim r's holder gave it up, or nil when it did not
-- say.
local function ended(r)
  if string.sub(r.attempt, 1, 1) == ENDED then return string.sub(r.attempt, 2) end
  return nil
end

-- reply describes a live record the way Claim and Lookup answer it, pttl
-- being its key's:
--   {'D', token, pttl, fingerprint, result}                         confirmed
--   {'R', token, pttl, fingerprint, result}                         confirmed by an operator
--   {'P', token, lease left, fingerprint, owner, n, cp[, ptoken, powner][, ended]}  a live claim
--   {'Q', token, pttl, fingerprint, owner, n, cp[, ptoken, powner][, ended]}        quarantined
-- where ended, why the holder gave the claim up, is there when it said.
local function reply(r, pttl)
  if r.st == 'D' then
    if r.op then return {'R', r.toks, pttl, r.fp, r.result} end
    return {'D', r.toks, pttl, r.fp, r.result}
  end
  local st, left = 'Q', pttl
  if r.st == 'C' then
    st = 'P'
    if pttl ~= -1 then left = pttl - r.keep end
  end
  local out = {st, r.toks, left, r.fp, r.owner, r.n, r.cp}
  if r.n > 0 then
    out[8] = r.ptoks
    out[9] = r.powner
  end
  local why = ended(r)
  if why then out[#out + 1] = why end
  return out
end

-- claimed answers a claim of key whose SET NX found record v, as claim.lua
-- does; px is the new claim's TTL (its lease plus its keep), tail its
-- value after "2C<token>:", toks the token it would have had, maxto the
-- store's MaxTakeOvers.
local function claimed(key, px, tail, toks, maxto, v)
  local r = decode(v)
  if not r then return DAMAGED end
  -- A confirmation, the common duplicate: nothing else to read.
  if r.st == 'D' then return reply(r, redis.call('PTTL', key)) end
  -- The claim's owner, attempt and keep are in its tail.
  local mine = decode('2C0:' .. tail)
  if not mine then return DAMAGED end
  local floor, prior = r.tok, nil
  if r.st ~= 'F' then
    local pttl = redis.call('PTTL', key)
    if r.st == 'Q' or live(r, pttl) then
      if r.st == 'C' and r.owner == mine.owner and r.attempt == mine.attempt then
        if pttl ~= -1 then pttl = pttl - r.keep end
        return {'A', r.toks, pttl}
      end
      return reply(r, pttl)
    end
    -- A lapsed claim: its holder crashed or stalled.
    if r.n >= tonumber(maxto) then
      -- The last take-over allowed lapsed too: stop the crash loop.
      r.st = 'Q'
      redis.call('SET', key, encode(r), 'PX', mine.keep)
      return reply(r, mine.keep)
    end
    prior = r
  end
  -- The new token must exceed a forgotten or lapsed claim's even in the
  -- same tick.
  if tonumber(toks) <= floor then toks = string.format('%d', floor + 1) end
  if prior then
    mine.st, mine.toks, mine.n, mine.ptoks, mine.powner, mine.cp =
      'C', toks, prior.n + 1, prior.toks, prior.owner, prior.cp
    redis.call('SET', key, encode(mine), 'PX', px)
    local out = {'T', toks, mine.n, mine.cp, prior.toks, prior.owner}
    local why = ended(prior)
    if why then out[7] = why end
    return out
  end
  redis.call('SET', key, '2C' .. toks .. ':' .. tail, 'PX', px)
  return {'C', toks}
end

-- confirmed answers a confirm of key whose record v is not the lease's own
-- claim; h is the hash that may hold its confirmation as a field. See
-- confirm.lua for the answers.
local function confirmed(key, v, held, retention, value, h)
  local toks = string.match(held, '^2C(%d+):')
  if not v then v = fieldDone(h, key) end
  if v then
    local r = decode(v)
    if not r then return DAMAGED end
    if r.st == 'D' then
      if r.toks == toks then return REPEAT end
      return NOT_KEPT
    end
  end
  -- Over anything else, a quarantined key included: the work happened.
  keepDone(key, h, value, retention)
  return LATE
end

-- confirm records key as done. held is how the lease's claim begins, keep
-- the claim's keep, value the whole confirmation, h the key's hash of the
-- field form or nil. See confirm.lua.
local function confirm(key, held, retention, value, keep, h)
  local v = redis.call('GET', key)
  if v and string.find(v, held, 1, true) == 1 then
    local pttl = redis.call('PTTL', key)
    keepDone(key, h, value, retention)
    if pttl == -1 or pttl >= tonumber(keep) then return HELD end
    return LATE
  end
  return confirmed(key, v, held, retention, value, h)
end

-- lost answers for a lease whose claim key's record v is not: 0, or DAMAGED.
local function lost(v)
  if v and not decode(v) then return DAMAGED end
  return 0
end
