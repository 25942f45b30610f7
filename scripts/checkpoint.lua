-- checkpoint: record a live lease's progress, for the next holder after a
-- take-over; or, with 'ended', why its holder gives the key up (Abandon).
--
-- KEYS[1]  the record
-- ARGV[1]  how the lease's claim begins: 2C<token>:<#owner>:<owner>
-- ARGV[2]  the claim's keep in milliseconds (see record.lua)
-- ARGV[3]  the checkpoint (empty: none); with 'ended', the reason
-- ARGV[4]  absent; 'ended' to record ARGV[3] as the reason the attempt
--          ends (see record.lua)
-- Reply:   1 recorded; 0 not held by this lease (expired, forgotten,
--          confirmed or taken over): a stalled holder never overwrites
--          its successor's progress; 'X' the record is damaged

-- #include record.lua

local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[1], 1, true) == 1 then
  if not live({keep = tonumber(ARGV[2])}, redis.call('PTTL', KEYS[1])) then return 0 end
  local r = decode(v)
  if not r then return DAMAGED end
  if ARGV[4] == 'ended' then
    r.attempt = ENDED .. ARGV[3]
  else
    r.cp = ARGV[3]
  end
  redis.call('SET', KEYS[1], encode(r), 'KEEPTTL')
  return 1
end
return lost(v)
