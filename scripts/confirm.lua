-- confirm: record the work as done, for the retention window.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 1C<token>:<#owner>:<owner>
-- ARGV[2]  retention in milliseconds
-- ARGV[3]  the confirmation: 1D<token>:<#fingerprint>:<fingerprint><result>,
--          with the lease's fingerprint, so a late confirm still records it
-- Reply:   1 confirmed, the lease was held
--          2 confirmed late: the lease had been lost (expired, forgotten or
--            taken over); the work happened, so it is recorded all the same
--          3 already confirmed by this lease (a repeat): nothing changed
--          4 already confirmed by another lease: the first confirmation stays
--          error 'idem: damaged record'

-- The common case, the lease's own claim: one read, one write.
local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[1], 1, true) == 1 then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  return 1
end

-- #include record.lua

local n = confirmed(KEYS[1], v, ARGV[1], ARGV[2], ARGV[3])
if n == 0 then return redis.error_reply(DAMAGED) end
return n
