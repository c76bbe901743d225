-- deregister: a worker that has drained (stopped taking assignments, finished the ones it
-- started) leaves. Whatever is still queued for it was never started by it and never will
-- be: waiting and granted-but-untaken calls alike are told 'offline' (not started).
-- KEYS: 1 reg, 2 queue, 3 entries, 4 env
-- ARGV: 1 incarnation, 2 wake key prefix, 3 status key prefix
-- Returns: number of calls told 'offline', or -1 when the incarnation is not the current one.
-- Clock: none (statuses are timed by Redis TIME).
local kreg, kq, ke = KEYS[1], KEYS[2], KEYS[3]
setup(kreg, kq, KEYS[4], nil, ARGV[3])
if redis.call('HGET', kreg, 'inc') ~= ARGV[1] then
  return -1
end
local now = clock_ms('')
local ids = redis.call('ZRANGE', kq, 0, -1)
for _, id in ipairs(ids) do
  push_wake(ARGV[2], id, cjson.encode({t = 'offline'}), WAKE_TTL_MS)
  local raw = redis.call('HGET', ke, id)
  if raw then
    fail_status(cjson.decode(raw), 'WORKER_OFFLINE', now)
  end
end
redis.call('DEL', kq, ke, kreg, KEYS[4])
return #ids
