-- backlog: what a refused call has ahead of it, read in one step for its Retry-After
-- (admission/backlog.py estimates from it). Read-only: it prunes nothing and grants nothing,
-- so an entry past its deadline may still be listed (the estimate drops it by its `dl`).
-- KEYS: 1 reg (HASH slots, ceil), 2 entries (HASH entry id -> JSON entry), 3 pace (LIST of
--       recent execution samples "<operation> <ms>", newest first)
-- ARGV: 1 now_ms or '', 2 how many samples to read
-- Returns: {now_ms, slots or '', ceil or '', {entry JSON ...}, {sample ...}}
-- Clock: ARGV[1] when given (tests), else Redis TIME.
local now = clock_ms(ARGV[1])
local reg = redis.call('HMGET', KEYS[1], 'slots', 'ceil')
local samples = redis.call('LRANGE', KEYS[3], 0, tonumber(ARGV[2]) - 1)
return {now, reg[1] or '', reg[2] or '', redis.call('HVALS', KEYS[2]), samples}
