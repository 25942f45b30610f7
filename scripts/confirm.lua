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

local v = redis.call('GET', KEYS[1])
local answer = 2
if v then
  local r = decode(v)
  if not r then return redis.error_reply(DAMAGED) end
  if r.st == 'D' then
    if r.toks == ARGV[2] then return 3 end
    return 4
  end
  if r.st == 'C' and r.owner == ARGV[1] and r.toks == ARGV[2] then answer = 1 end
end
redis.call('SET', KEYS[1], done(ARGV[2], ARGV[4], ARGV[5]), 'PX', ARGV[3])
return answer
