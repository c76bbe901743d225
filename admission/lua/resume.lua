-- resume: a drained worker grants again. The drain flag goes and the queue is granted in
-- the grant's order in the same step, exactly as a freed slot would grant it (see grant()).
-- KEYS: 1 reg, 2 queue, 3 entries, 4 drain flag (<tag>:drain), 5 env,
--       6 the worker's Celery queue list (optional, see enter.lua)
-- ARGV: 1 now_ms or '', 2 slot ceiling, 3 wake key prefix, 4 status key prefix,
--       5 revoked-key marker prefix ('' = unchecked; see _common.lua)
-- Returns: {was drained (1 or 0), how many calls it granted}
-- Clock: ARGV[1] when given (tests), else Redis TIME.
local kreg, kq, ke = KEYS[1], KEYS[2], KEYS[3]
setup(kreg, kq, KEYS[5], KEYS[6], ARGV[4], ARGV[5])
local now = clock_ms(ARGV[1])
local was = redis.call('DEL', KEYS[4])
if not redis.call('HGET', kreg, 'inc') then
  return {was, 0}
end
local entries = load_entries(kq, ke, now, ARGV[3])
local granted = grant(entries, now, slot_count(kreg, ARGV[2]), ke, ARGV[3], '')
refresh_ttl(kq, ke, entries, now)
return {was, #granted}
