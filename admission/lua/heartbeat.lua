-- heartbeat: keep a worker's registration alive, only for its current incarnation.
-- KEYS: 1 reg
-- ARGV: 1 incarnation, 2 registration ttl ms
-- Returns: 1 when renewed, 0 when the incarnation was replaced or has expired (re-register).
-- Clock: none.
if redis.call('HGET', KEYS[1], 'inc') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
