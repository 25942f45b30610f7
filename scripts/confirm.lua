-- confirm: record the work as done, for the retention window.
--
-- KEYS[1]  the record
-- KEYS[2]  absent; with RedisOptions.FieldHashes, the hash that keeps a
--          short confirmation as a field (see record.lua)
-- ARGV[1]  retention in milliseconds
-- ARGV[2]  the claim's keep in milliseconds (see record.lua): the lease is
--          live while the key's PTTL is at least that
-- ARGV[3]  how the lease's claim begins: 2C<token>:<#owner>:<owner>
-- ARGV[4]  the confirmation: 1D<token>:<#fingerprint>:<fingerprint><result>,
--          with the lease's fingerprint, so a late confirm still records it
-- Reply:   1 confirmed, the lease was held
--          2 confirmed late: the lease had been lost (expired, forgotten or
--            taken over); the work happened, so it is recorded all the same
--          3 already confirmed by this lease (a repeat): nothing changed
--          4 already confirmed by another lease: the first confirmation stays
--          'X' the record is damaged

-- The common case, the lease's own claim: one read, one write.
local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[3], 1, true) == 1 then
  local pttl = redis.call('PTTL', KEYS[1])
  -- record.lua's keepDone, which is not included yet.
  local f = KEYS[2] and #ARGV[4] == 16 and string.match(KEYS[1], '{(.*)}$')
  if f and #f <= 64 and redis.pcall('HSETEX', KEYS[2], 'PX', ARGV[1], 'FIELDS', 1, f, ARGV[4]) == 1 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[1])
  end
  -- HELD, or LATE when the lease had lapsed.
  if pttl == -1 or pttl >= tonumber(ARGV[2]) then return 1 end
  return 2
end

-- #include record.lua

return confirmed(KEYS[1], v, ARGV[3], ARGV[1], ARGV[4], KEYS[2])
