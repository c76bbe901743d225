-- enter: admit a call to a worker's queue, or refuse it at once.
-- Prunes expired entries, refuses when the worker is not registered ('offline') or already
-- holds queue_limit entries, running ones included ('full'); else appends the entry with the
-- next ticket and grants what may start (this entry and, when a slot just freed by expiry,
-- older ones too).
-- KEYS: 1 reg (HASH inc, slots, ceil, seq), 2 queue (ZSET), 3 entries (HASH), 4 stats (HASH)
-- ARGV: 1 now_ms or '' , 2 entry id, 3 key base, 4 key lane ('' = checkout), 5 queue budget ms,
--       6 exec budget ms, 7 queue limit, 8 slot ceiling, 9 wake key prefix, 10 operation,
--       11 stats ttl ms
-- Returns: {'offline'} | {'full', held} |
--          {'granted', ticket, slot, incarnation, admitted_ms, exec_deadline_ms} |
--          {'waiting', ticket, incarnation, now_ms, queue_deadline_ms}
-- Clock: ARGV[1] when given (tests), else Redis TIME.
local kreg, kq, ke, kstats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = clock_ms(ARGV[1])
local inc = redis.call('HGET', kreg, 'inc')
if not inc then
  return {'offline'}
end
local slots = slot_count(kreg, ARGV[8])
local entries = load_entries(kq, ke, now, ARGV[9])
if #entries >= tonumber(ARGV[7]) then
  bump(kstats, 'queue_full', tonumber(ARGV[11]))
  return {'full', #entries}
end
local seq = redis.call('HINCRBY', kreg, 'seq', 1)
local e = {
  id = ARGV[2], seq = seq, base = ARGV[3], lane = ARGV[4], st = 'w',
  dl = now + tonumber(ARGV[5]), xb = tonumber(ARGV[6]), inc = inc, op = ARGV[10], t0 = now,
}
entries[#entries + 1] = e
redis.call('ZADD', kq, seq, e.id)
redis.call('HSET', ke, e.id, cjson.encode(e))
grant(entries, now, slots, ke, ARGV[9], e.id)
refresh_ttl(kq, ke, entries, now)
if e.st == 'r' then
  return {'granted', seq, e.slot, inc, e.ta, e.dl}
end
return {'waiting', seq, inc, now, e.dl}
