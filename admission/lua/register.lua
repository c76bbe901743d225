-- register: a worker (re)registers. A new incarnation replaces the old one: calls waiting for
-- the old incarnation are told 'offline' (not started) and calls running on it 'vanished'
-- (outcome unknown); none of them moves to the new incarnation.
-- KEYS: 1 reg, 2 queue, 3 entries
-- ARGV: 1 incarnation, 2 slots, 3 registration ttl ms, 4 wake key prefix
-- Returns: {waiting dropped, running dropped}
-- Clock: none.
local kreg, kq, ke = KEYS[1], KEYS[2], KEYS[3]
local old = redis.call('HGET', kreg, 'inc')
local waiting, running = 0, 0
if old ~= ARGV[1] then
  local ids = redis.call('ZRANGE', kq, 0, -1)
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', ke, id)
    if raw then
      local x = cjson.decode(raw)
      if x.st == 'r' then
        running = running + 1
        push_wake(ARGV[4], id, cjson.encode({t = 'vanished'}), WAKE_TTL_MS)
      else
        waiting = waiting + 1
        push_wake(ARGV[4], id, cjson.encode({t = 'offline'}), WAKE_TTL_MS)
      end
    end
  end
  redis.call('DEL', kq, ke)
end
redis.call('HSET', kreg, 'inc', ARGV[1], 'slots', ARGV[2])
redis.call('PEXPIRE', kreg, tonumber(ARGV[3]))
return {waiting, running}
