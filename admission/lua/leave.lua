-- leave: take a waiting call out of the queue (its caller gave up, disconnected or was
-- cancelled). Never touches a running call: a call granted meanwhile is reported instead.
-- Removing a waiter can unblock younger calls on its key, so it grants afterwards.
-- KEYS: 1 reg, 2 queue, 3 entries, 4 env, 5 Celery queue list (optional, see enter.lua)
-- ARGV: 1 now_ms or '', 2 entry id, 3 slot ceiling, 4 wake key prefix,
--       5 message to push to the leaving entry's wake list ('' = none; DELETE uses it to
--       tell the waiting request it was cancelled), 6 status key prefix,
--       7 the leaving call's status code ('' = none; cancelled: REQUEST_CANCELLED),
--       8 revoked-key marker prefix ('' = unchecked; see _common.lua),
--       9 who cancelled it ('' = its own client; 'operator': admission/operator.py), kept in a
--         cancelled call's status so its completion row says so
-- Returns: {'gone'} | {'left'} |
--          {'running', ticket, slot, incarnation, admitted_ms, exec_deadline_ms, dispatched,
--           out_of_order}
-- Clock: ARGV[1] when given (tests), else Redis TIME.
local kreg, kq, ke = KEYS[1], KEYS[2], KEYS[3]
setup(kreg, kq, KEYS[4], KEYS[5], ARGV[6], ARGV[8])
local now = clock_ms(ARGV[1])
local raw = redis.call('HGET', ke, ARGV[2])
if not raw then
  return {'gone'}
end
local x = cjson.decode(raw)
if x.st == 'r' then
  return {'running', x.seq, x.slot, x.inc, x.ta, x.dl, x.dp or 0, x.oo or 0}
end
remove_entry(kq, ke, ARGV[2])
if ARGV[5] ~= '' then
  push_wake(ARGV[4], ARGV[2], ARGV[5], WAKE_TTL_MS)
end
if ARGV[7] == 'REQUEST_CANCELLED' then
  set_status(x, 'cancelled', (ARGV[9] or '') ~= '' and {by = ARGV[9]} or nil, now)
elseif ARGV[7] ~= '' then
  fail_status(x, ARGV[7], now)
end
local entries = load_entries(kq, ke, now, ARGV[4])
grant(entries, now, slot_count(kreg, ARGV[3]), ke, ARGV[4], '')
refresh_ttl(kq, ke, entries, now)
return {'left'}
