-- confirm_batch: confirm several leases, as confirm.lua does each, in order,
-- in one call. Only for keys that may share a script call (a single Redis).
--
-- KEYS     the records; with RedisOptions.FieldHashes, followed by each
--          one's field hash (confirm.lua's KEYS[2]), in the same order
-- ARGV[1]  retention in milliseconds
-- ARGV[2]  the claims' keep in milliseconds, as ARGV[2] of confirm.lua
-- ARGV[2i+1], ARGV[2i+2]  key i's claim prefix and confirmation, as ARGV[3]
--          and ARGV[4] of confirm.lua
-- Reply:   one confirm.lua answer per key ('X' for a damaged record)

-- #include record.lua

local out = {}
local n = (#ARGV - 2) / 2
for i = 1, n do
  out[i] = confirm(KEYS[i], ARGV[2 * i + 1], ARGV[1], ARGV[2 * i + 2], ARGV[2], KEYS[n + i])
end
return out
