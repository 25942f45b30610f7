-- resolve: an operator settles a quarantined key.
--
-- KEYS[1]  the record
-- ARGV[1]  'confirm' (record the work as done) or 'forget' (run it again)
-- ARGV[2]  with confirm, the retention in milliseconds; with forget, how
--          long the forgotten claim's token is kept (a lease)
-- ARGV[3]  with confirm, the result
-- Reply:   1 settled; 0 the key is not quarantined (nothing written);
--          'X' the record is damaged
-- A confirmation gets a token of its own (the clock, past the last
-- attempt's), so that the last attempt's late confirm is told that
-- another confirmation was kept.

-- #include record.lua

local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local r = decode(v)
if not r then return DAMAGED end
if r.st ~= 'Q' then return 0 end
local t = redis.call('TIME')
local toks = t[1] .. string.sub('00000' .. t[2], -6)
if tonumber(toks) <= r.tok then toks = string.format('%d', r.tok + 1) end
if ARGV[1] == 'confirm' then
  redis.call('SET', KEYS[1], '1D' .. toks .. ':' .. #r.fp .. ':' .. r.fp .. ARGV[3], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], '1F' .. r.toks, 'PX', ARGV[2])
end
return 1
