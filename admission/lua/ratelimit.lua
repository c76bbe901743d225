-- ratelimit.lua: take `cost` units from one principal's budget, or refuse and change nothing.
--
-- Algorithm: GCRA (generic cell rate algorithm) with burst = limit. The only state is the
-- theoretical arrival time TAT; `TAT - now` (when positive) is the backlog, the time the
-- bucket needs to drain back to full. One unit adds window/limit to it, and a request fits
-- iff the backlog after it is at most one window. A fresh principal can therefore spend the
-- whole limit at once, after which the budget refills smoothly at limit/window.
--
-- Exactness: window/limit is rarely a whole number of ms (7/10s -> 1428.57 ms), so every
-- time below is measured in "scaled ms" (ms * limit): one unit costs window_ms scaled ms and
-- a full window is limit * window_ms. All values are integers below 2^53 (limit <= 1e6,
-- window <= 24 h), which Lua's doubles hold exactly, so no decision depends on rounding.
-- TAT is stored as a whole ms plus a remainder: TAT = tat_ms + tat_frac / limit.
--
-- KEYS[1]  the principal's bucket, a hash {tat_ms, tat_frac}. Its TTL is the time until the
--          bucket is full again; an expired key and a full bucket mean the same thing.
-- ARGV[1]  limit: units per window, integer 1..1e6
-- ARGV[2]  window_ms: integer 1000..86400000
-- ARGV[3]  cost: units this request takes, integer >= 1
-- ARGV[4]  now_ms: "0" (or empty) = use the Redis server clock; tests pass fixed values
--
-- Returns  {allowed (1|0), remaining, reset_s, retry_after_s, retry_after_ms}
--          remaining      units that would still pass right now (0 when refused)
--          reset_s        whole seconds until the bucket is full again, rounded up
--          retry_after_s  whole seconds until this same request would pass, rounded up
--                         (>= 1 when refused, 0 when allowed). A cost above the limit can
--                         never pass; it is refused with retry_after_s = the window.
--          retry_after_ms the same in whole ms, rounded up (0 when allowed): until then
--                         this request is refused again, so an API process may repeat the
--                         refusal without asking Redis (api/execute/burst.py).
--          A refused request writes nothing, not even the TTL.
--
-- Clock    Redis server TIME, never the API host's, so every API process shares one clock.
--          ARGV[4] overrides it for tests only.

local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now_ms = tonumber(ARGV[4])
if now_ms == nil or now_ms <= 0 then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Exact for non-negative integers below 2^53: the true quotient is at least 1/b away from the
-- next integer, which is more than a double's rounding error at these magnitudes.
local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- Backlog in scaled ms. A TAT in the past means the bucket is full (backlog 0). If the server
-- clock steps backwards the backlog grows by the step; that only delays, it never over-admits.
local backlog = 0
local state = redis.call('HMGET', KEYS[1], 'tat_ms', 'tat_frac')
if state[1] then
  local tat_ms = tonumber(state[1])
  if tat_ms >= now_ms then
    backlog = (tat_ms - now_ms) * limit + (tonumber(state[2]) or 0)
  end
end

local capacity = limit * window_ms
local scaled_s = limit * 1000
local reset_s = ceil_div(backlog, scaled_s)

-- Checked before multiplying so an absurd cost cannot push cost * window_ms past 2^53.
if cost > limit then
  return {0, 0, reset_s, ceil_div(window_ms, 1000), window_ms}
end

local after = backlog + cost * window_ms
if after > capacity then
  return {0, 0, reset_s, ceil_div(after - capacity, scaled_s), ceil_div(after - capacity, limit)}
end

local whole_ms = math.floor(after / limit)
-- string.format('%d') because Redis would render a bare Lua number with %.14g.
redis.call('HSET', KEYS[1],
  'tat_ms', string.format('%d', now_ms + whole_ms),
  'tat_frac', string.format('%d', after - whole_ms * limit))
redis.call('PEXPIRE', KEYS[1], string.format('%d', ceil_div(after, limit)))
return {1, math.floor((capacity - after) / window_ms), ceil_div(after, scaled_s), 0, 0}
