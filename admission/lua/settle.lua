-- settle: a worker hands back the result of an assignment. Accepted only while the entry is
-- live, running, and the fence matches (incarnation and ticket); then the result is pushed to
-- the waiting request (and kept as a durable call's status), the slot is freed and waiting
-- calls are granted and dispatched, all in one step. Runs with the worker's own Redis rights:
-- it touches only the worker's `{w:<id>}` keys and its own Celery queue, and reads the
-- revoked-key markers (one EXISTS per key id among the waiting calls).
-- A late, duplicate or stale settlement is discarded and counted.
-- KEYS: 1 reg, 2 queue, 3 entries, 4 stats, 5 env, 6 Celery queue list (optional)
-- ARGV: 1 now_ms or '', 2 entry id, 3 incarnation, 4 ticket, 5 result payload, 6 wake key prefix,
--       7 stats ttl ms, 8 status key prefix, 9 revoked-key marker prefix ('' = unchecked; the
--       worker's Redis user may read the markers, admission/credentials.py), 10 '1' when the
--       settling worker thread takes the next granted call itself (optional)
-- Returns: {'accepted', envelope or '', its entry (JSON) or ''} | {'discarded'}
-- The handed envelope is the Celery message the grant would have pushed onto the worker's
-- queue: taken here, it is dispatched exactly as if the worker had popped it. Its entry is the
-- one this very step granted and saved (ticket, slot, incarnation, exec deadline).
-- Clock: ARGV[1] when given (tests), else Redis TIME (never the worker's own clock).
local kreg, kq, ke, kstats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
setup(kreg, kq, KEYS[5], KEYS[6], ARGV[8], ARGV[9])
D.take = ARGV[10] == '1'
local now = clock_ms(ARGV[1])
local raw = redis.call('HGET', ke, ARGV[2])
local x = raw and cjson.decode(raw) or nil
if x == nil or x.st ~= 'r' or x.inc ~= ARGV[3] or tostring(x.seq) ~= ARGV[4] or x.dl <= now then
  bump(kstats, 'settle_discarded', tonumber(ARGV[7]))
  return {'discarded'}
end
remove_entry(kq, ke, ARGV[2])
push_wake(ARGV[6], ARGV[2], ARGV[5], WAKE_TTL_MS)
-- The API reads the payload (signature, result rules) when it answers the status. A
-- synchronous call's status does without it (its waiter reads the wake list).
set_status(x, 'settled', x.du == 1 and {payload = ARGV[5], te = now} or {te = now}, now)
local entries = load_entries(kq, ke, now, ARGV[6])
grant(entries, now, slot_count(kreg, ''), ke, ARGV[6], '')
refresh_ttl(kq, ke, entries, now)
return {'accepted', D.taken or '', D.taken_entry and cjson.encode(D.taken_entry) or ''}
