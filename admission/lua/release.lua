-- release: free a call's place (running or waiting) when its API process is done with it
-- without a settlement: its exec deadline passed, or a waiter went away after its grant.
-- Fenced by ticket, so a stale release cannot free a newer call's slot. Grants afterwards.
-- KEYS: 1 reg, 2 queue, 3 entries, 4 env, 5 Celery queue list (optional, see enter.lua)
-- ARGV: 1 now_ms or '', 2 entry id, 3 ticket, 4 slot ceiling, 5 wake key prefix,
--       6 status key prefix, 7 revoked-key marker prefix ('' = unchecked; see _common.lua)
-- Returns: {'released'} | {'gone'} (settled or expired already)
-- Clock: ARGV[1] when given (tests), else Redis TIME.
local kreg, kq, ke = KEYS[1], KEYS[2], KEYS[3]
setup(kreg, kq, KEYS[4], KEYS[5], ARGV[6], ARGV[7])
local now = clock_ms(ARGV[1])
local raw = redis.call('HGET', ke, ARGV[2])
local x = raw and cjson.decode(raw) or nil
if not x or tostring(x.seq) ~= ARGV[3] then
  return {'gone'}
end
remove_entry(kq, ke, ARGV[2])
fail_status(x, x.st == 'w' and 'WORKSPACE_QUEUE_TIMEOUT' or 'ASSIGNMENT_EXPIRED', now)
local entries = load_entries(kq, ke, now, ARGV[5])
grant(entries, now, slot_count(kreg, ARGV[4]), ke, ARGV[5], '')
refresh_ttl(kq, ke, entries, now)
return {'released'}
