-- confirm: record the work as done, for the retention window.
--
-- KEYS[1]  the record
-- ARGV[1]  owner
-- ARGV[2]  token
-- ARGV[3]  retention in milliseconds
-- ARGV[4]  fingerprint (the lease's, so a late confirm still records it)
-- ARGV[5]  result
-- Reply:   1 confirmed, the lease was held
--          2 confirmed late: the lease had been lost (expired, forgotten or
--            taken over); the work happened, so it is recorded all the same
--          3 already confirmed by this lease (a repeat): nothing changed
--          4 already confirmed by another lease: the first confirmation stays
--          error 'idem: damaged record'

local n = confirm(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if n == 0 then return redis.error_reply(DAMAGED) end
return n
