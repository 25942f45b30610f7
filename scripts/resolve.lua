-- resolve: an operator settles a quarantined key, or clears any key.
--
-- KEYS[1]  the record
-- KEYS[2]  absent; with RedisOptions.FieldHashes, the hash that may keep
--          the key's confirmation as a field (see record.lua): clear
--          removes it
-- ARGV[1]  'confirm' (record the work as done), 'forget' (run it again)
--          or 'clear' (remove whatever the key holds but a live claim)
-- ARGV[2]  with confirm, the retention in milliseconds; with forget and
--          clear, how long the forgotten claim's token is kept (a lease)
-- ARGV[3]  with confirm, the result
-- Reply:   1 settled; 0 the key is not quarantined (with clear: has no
--          record), nothing written; 2 (clear) a live claim, left as it
--          is; 'X' the record is damaged (never with clear, which removes
--          it)
-- A confirmation gets a token of its own (the clock, past the last
-- attempt's), so that the last attempt's late confirm is told that
-- another confirmation was kept. It is written as an operator's (2R, see
-- record.lua): its result is the plain one the front door documents.

-- #include record.lua

local v = redis.call('GET', KEYS[1])
if not v then
  if ARGV[1] == 'clear' and KEYS[2] then return redis.call('HDEL', KEYS[2], field(KEYS[1])) end
  return 0
end
local r = decode(v)
if ARGV[1] == 'clear' then
  if not r then
    -- Damaged: nothing can be read of it, not even a token to keep.
    redis.call('DEL', KEYS[1])
    return 1
  end
  if r.st == 'F' then return 0 end
  if r.st == 'C' and live(r, redis.call('PTTL', KEYS[1])) then return 2 end
  redis.call('SET', KEYS[1], '1F' .. r.toks, 'PX', ARGV[2])
  return 1
end
if not r then return DAMAGED end
if r.st ~= 'Q' then return 0 end
local t = redis.call('TIME')
local toks = t[1] .. string.sub('00000' .. t[2], -6)
if tonumber(toks) <= r.tok then toks = string.format('%d', r.tok + 1) end
if ARGV[1] == 'confirm' then
  redis.call('SET', KEYS[1], '2R' .. toks .. ':' .. #r.fp .. ':' .. r.fp .. ARGV[3], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], '1F' .. r.toks, 'PX', ARGV[2])
end
return 1
