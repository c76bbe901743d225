-- enter: admit a call to a worker's queue, or refuse it at once.
-- Prunes expired entries, refuses when the worker is not registered ('offline') or already
-- holds queue_limit entries, running ones included ('full'); else appends the entry with the
-- next ticket (and its envelope, and for a durable call its status) and grants what may
-- start (this entry and, when a slot just freed by expiry, older ones too), dispatching
-- each grant (see _common.lua).
-- KEYS: 1 reg (HASH inc, slots, ceil, seq, o:<workspace>), 2 queue (ZSET), 3 entries (HASH),
--       4 stats (HASH), 5 env (HASH), 6 the worker's Celery queue list (absent: not reachable
--       from this Redis; the caller pushes the envelope)
-- ARGV: 1 now_ms or '' , 2 entry id, 3 key base, 4 key lane ('' = checkout), 5 queue budget ms,
--       6 exec budget ms, 7 queue limit, 8 slot ceiling, 9 wake key prefix, 10 operation,
--       11 stats ttl ms, 12 workspace id, 13 needed offer tokens (SEP-joined, '' = unchecked),
--       14 envelope ('' = none), 15 '1' for a durable call, 16 status key prefix,
--       17 the incarnation the envelope was signed for ('' = the registered one): a call whose
--       caller saw an older incarnation enters under that one, so the grant refuses it
--       (WORKER_OFFLINE, not started) instead of dispatching what the worker would drop,
--       18 the caller's API key id ('' = none), 19 revoked-key marker prefix ('' = unchecked;
--       see setup() in _common.lua), 20 a synchronous call's completion row draft ('' = none),
--       21 its key, 22 its TTL ms, 23 the index of calls owing a row ('' = not listed: a
--       cluster, where it lives in another slot), 24 the call's member there, 25 its TTL ms.
--       A call with a draft keeps a status as a durable one does (rw = 1), and the draft is
--       saved only if it entered: whatever the call does next, the sweep finds both.
--       26 the call's flow ('' = the one flow of callers that name none), 27 the share of the
--       queue limit one flow may hold while another is in the queue, in percent ('' = 100;
--       see share_room in _common.lua), 28 '1' when the call only reads (it shares its key
--       with other reads; see conflicts in _common.lua)
-- Returns: {'offline'} | {'full', held} | {'refused', code} |
--          {'granted', ticket, slot, incarnation, admitted_ms, exec_deadline_ms, dispatched,
--           out_of_order} |
--          {'waiting', ticket, incarnation, now_ms, queue_deadline_ms}
-- Clock: ARGV[1] when given (tests), else Redis TIME.
local kreg, kq, ke, kstats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
setup(kreg, kq, KEYS[5], KEYS[6], ARGV[16], ARGV[19])
local now = clock_ms(ARGV[1])
local inc = redis.call('HGET', kreg, 'inc')
if not inc then
  return {'offline'}
end
local slots = slot_count(kreg, ARGV[8])
local entries = load_entries(kq, ke, now, ARGV[9])
local limit = tonumber(ARGV[7])
local fl = ARGV[26] or ''
local share = tonumber(ARGV[27] or '') or 100
local over_share
entries, over_share = share_room(
  entries, fl, math.max(1, math.floor(limit * share / 100)), limit, now, ke, ARGV[9])
if over_share or #entries >= limit then
  bump(kstats, 'queue_full', tonumber(ARGV[11]))
  return {'full', #entries}
end
local seq = redis.call('HINCRBY', kreg, 'seq', 1)
local signed_for = (ARGV[17] ~= nil and ARGV[17] ~= '') and ARGV[17] or inc
local e = {
  id = ARGV[2], seq = seq, base = ARGV[3], lane = ARGV[4], st = 'w',
  dl = now + tonumber(ARGV[5]), xb = tonumber(ARGV[6]), inc = signed_for, op = ARGV[10], t0 = now,
  ws = ARGV[12], fl = fl, vt = fair_tag(entries, fl),
}
if ARGV[13] ~= '' then
  local nd = {}
  for tok in string.gmatch(ARGV[13], '[^' .. SEP .. ']+') do nd[#nd + 1] = tok end
  e.nd = nd
end
if ARGV[15] == '1' then
  e.du = 1
end
if ARGV[28] == '1' then
  e.rd = 1
end
if ARGV[18] ~= nil and ARGV[18] ~= '' then
  e.kid = ARGV[18]
end
if ARGV[20] ~= nil and ARGV[20] ~= '' then
  e.rw = 1
end
entries[#entries + 1] = e
redis.call('ZADD', kq, seq, e.id)
redis.call('HSET', ke, e.id, cjson.encode(e))
if ARGV[14] ~= '' then
  redis.call('HSET', D.env, e.id, ARGV[14])
end
set_status(e, 'queued', nil, now)
grant(entries, now, slots, ke, ARGV[9], e.id)
refresh_ttl(kq, ke, entries, now)
if e.refused then
  return {'refused', e.refused}
end
if e.rw == 1 then
  redis.call('SET', ARGV[21], ARGV[20], 'PX', tonumber(ARGV[22]))
  if ARGV[23] ~= '' then
    redis.call('ZADD', ARGV[23], now, ARGV[24])
    redis.call('PEXPIRE', ARGV[23], tonumber(ARGV[25]))
  end
end
if e.st == 'r' then
  return {'granted', seq, e.slot, inc, e.ta, e.dl, e.dp or 0, e.oo or 0}
end
return {'waiting', seq, inc, now, e.dl}
