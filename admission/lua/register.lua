-- register: a worker (re)registers. A new incarnation replaces the old one: calls waiting for
-- the old incarnation are told 'offline' (not started) and calls running on it 'vanished'
-- (outcome unknown); none of them moves to the new incarnation. The offer (what each
-- workspace takes, checked by every grant) is replaced with the one given.
-- KEYS: 1 reg, 2 queue, 3 entries, 4 env
-- ARGV: 1 incarnation, 2 slots, 3 registration ttl ms, 4 wake key prefix, 5 status key prefix,
--       6 offer: JSON {workspace id: SEP-delimited tokens} ('' = leave the offer as it is)
-- Returns: {waiting dropped, running dropped}
-- Clock: none (statuses are timed by Redis TIME).
local kreg, kq, ke = KEYS[1], KEYS[2], KEYS[3]
setup(kreg, kq, KEYS[4], nil, ARGV[5])
local old = redis.call('HGET', kreg, 'inc')
local waiting, running = 0, 0
if old ~= ARGV[1] then
  local now = clock_ms('')
  local ids = redis.call('ZRANGE', kq, 0, -1)
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', ke, id)
    if raw then
      local x = cjson.decode(raw)
      if x.st == 'r' then
        running = running + 1
        push_wake(ARGV[4], id, cjson.encode({t = 'vanished'}), WAKE_TTL_MS)
        fail_status(x, 'ASSIGNMENT_EXPIRED', now)
      else
        waiting = waiting + 1
        push_wake(ARGV[4], id, cjson.encode({t = 'offline'}), WAKE_TTL_MS)
        fail_status(x, 'WORKER_OFFLINE', now)
      end
    end
  end
  redis.call('DEL', kq, ke, KEYS[4])
end
if ARGV[6] ~= '' then
  for _, field in ipairs(redis.call('HKEYS', kreg)) do
    if string.sub(field, 1, 2) == 'o:' then
      redis.call('HDEL', kreg, field)
    end
  end
  for ws, tokens in pairs(cjson.decode(ARGV[6])) do
    redis.call('HSET', kreg, 'o:' .. ws, tokens)
  end
end
redis.call('HSET', kreg, 'inc', ARGV[1], 'slots', ARGV[2])
redis.call('PEXPIRE', kreg, tonumber(ARGV[3]))
return {waiting, running}
