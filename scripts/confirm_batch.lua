-- confirm_batch: confirm several leases, as confirm.lua does each, in one
-- call. Only for keys that may share a script call (a single Redis).
--
-- KEYS     the records
-- ARGV[1]  retention in milliseconds
-- ARGV[2+3(i-1)] .. ARGV[4+3(i-1)]  key i's claim prefix, token and
--          confirmation, as ARGV[1], ARGV[2] and ARGV[4] of confirm.lua
-- Reply:   one confirm.lua answer per key, 0 for a damaged record

local out = {}
for i = 1, #KEYS do
  local a = 2 + 3 * (i - 1)
  out[i] = confirm(KEYS[i], ARGV[a], ARGV[a + 1], ARGV[1], ARGV[a + 2])
end
return out
