-- heartbeat: keep a worker's registration alive, only for its current incarnation.
-- KEYS: 1 reg
-- ARGV: 1 incarnation, 2 registration ttl ms
-- Returns: 1 when renewed, 0 when another incarnation holds the registration (replaced),
-- -1 when there is no registration at all (it expired, or Redis restarted empty).
-- Clock: none.
local current = redis.call('HGET', KEYS[1], 'inc')
if not current then
  return -1
end
if current ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
