-- confirm_batch: confirm several leases, as confirm.lua does each, in order,
-- in one call. Only for keys that may share a script call (a single Redis).
--
-- KEYS     the records
-- ARGV[1]  retention in milliseconds
-- ARGV[2i], ARGV[2i+1]  key i's claim prefix and confirmation, as ARGV[1]
--          and ARGV[3] of confirm.lua
-- Reply:   one confirm.lua answer per key, 0 for a damaged record

-- The common case, each lease's own claim: one read and one write each,
-- until the first key that is not.
local out = {}
local i = 1
local v
while i <= #KEYS do
  v = redis.call('GET', KEYS[i])
  if not (v and string.find(v, ARGV[2 * i], 1, true) == 1) then break end
  redis.call('SET', KEYS[i], ARGV[2 * i + 1], 'PX', ARGV[1])
  out[i] = 1
  i = i + 1
end
if i > #KEYS then return out end

-- #include record.lua

-- From the first key that is not on, each in order, as confirm.lua would.
out[i] = confirmed(KEYS[i], v, ARGV[2 * i], ARGV[1], ARGV[2 * i + 1])
for j = i + 1, #KEYS do
  out[j] = confirm(KEYS[j], ARGV[2 * j], ARGV[1], ARGV[2 * j + 1])
end
return out
