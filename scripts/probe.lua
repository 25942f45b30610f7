-- probe: what the store's scripts rely on, asked of the server on first
-- contact: TIME inside a script (fencing tokens come from it), SET NX PX
-- exclusive with its TTL (every claim is one), and every other command the
-- scripts call (GET, PEXPIRE), so that an ACL user without one is refused
-- at first contact, not at the first renewal. It leaves nothing behind.
--
-- KEYS[1]  a key of the store's prefix that nothing else uses
-- ARGV[1]  a TTL in milliseconds
-- Reply:   {seconds, microseconds, first, second, pttl}: TIME's two parts;
--          1 when the first SET NX PX wrote, else 0; 1 when a second SET
--          NX PX on the same key wrote (it must not), else 0; the key's
--          PTTL after the first SET.
local t = redis.call('TIME')
redis.call('DEL', KEYS[1])
local first = redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) and 1 or 0
-- Read before PEXPIRE below, which would set a TTL of its own and hide a
-- server whose SET ignores PX.
local pttl = redis.call('PTTL', KEYS[1])
local second = redis.call('SET', KEYS[1], '2', 'NX', 'PX', ARGV[1]) and 1 or 0
redis.call('GET', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[1])
return {t[1], t[2], first, second, pttl}
