-- confirm: record the work as done, for the retention window.
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 1C<token>:<#owner>:<owner>
-- ARGV[2]  the lease's token
-- ARGV[3]  retention in milliseconds
-- ARGV[4]  the confirmation: 1D<token>:<#fingerprint>:<fingerprint><result>,
--          with the lease's fingerprint, so a late confirm still records it
-- Reply:   1 confirmed, the lease was held
--          2 confirmed late: the lease had been lost (expired, forgotten or
--            taken over); the work happened, so it is recorded all the same
--          3 already confirmed by this lease (a repeat): nothing changed
--          4 already confirmed by another lease: the first confirmation stays
--          error 'idem: damaged record'

local n = confirm(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if n == 0 then return redis.error_reply(DAMAGED) end
return n
