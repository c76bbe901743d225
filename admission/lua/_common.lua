-- Shared by every admission script (queue.py prepends this file to each of them).
--
-- A worker's queue is two keys: a ZSET (member: entry id, score: the entry's ticket, so
-- ZRANGE is arrival order) and a HASH (entry id -> JSON entry). An entry is waiting
-- (st = 'w', dl = its queue deadline) or running (st = 'r', dl = its exec deadline, slot).
-- Running entries stay in the queue and count toward WORKER_QUEUE_LIMIT until released.
-- Clock: ARGV now_ms when a test passes one, else Redis server TIME, so API hosts and
-- workers (whose clocks may differ) all see one clock.

local WAKE_TTL_MS = 60000
-- A grant pushed to a waiter that was blocked on its wake list is taken at once. One still
-- lying in the list this long after the grant means nobody is listening (the API process
-- died): the entry is dropped instead of holding its slot until its exec deadline.
local CLAIM_MS = 3000

local function clock_ms(arg)
  if arg ~= nil and arg ~= '' and arg ~= '0' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function conflicts(a, b)
  return a.base == b.base and (a.lane == '' or b.lane == '' or a.lane == b.lane)
end

-- Entries in arrival order, with those past their own deadline (or never claimed) removed.
local function load_entries(kq, ke, now, wake_prefix)
  local ids = redis.call('ZRANGE', kq, 0, -1)
  local entries = {}
  if #ids == 0 then
    return entries
  end
  local raws = redis.call('HMGET', ke, unpack(ids))
  for i, id in ipairs(ids) do
    local raw = raws[i]
    local e = raw and cjson.decode(raw) or nil
    local unclaimed = e ~= nil and e.st == 'r' and e.wk == 1 and now - e.ta >= CLAIM_MS
      and redis.call('LLEN', wake_prefix .. id) > 0
    if e == nil or e.dl <= now or unclaimed then
      redis.call('ZREM', kq, id)
      redis.call('HDEL', ke, id)
      if unclaimed then
        redis.call('DEL', wake_prefix .. id)
      end
    else
      entries[#entries + 1] = e
    end
  end
  return entries
end

local function remove_entry(kq, ke, id)
  redis.call('ZREM', kq, id)
  redis.call('HDEL', ke, id)
end

-- The list keeps the message; the announcement on the worker's shard channel (the wake
-- prefix itself: same hash tag, so same slot as every key here) wakes the API process that
-- waits for it (admission/waiters.py). Needs Redis 7 (sharded pub/sub).
local function push_wake(wake_prefix, id, message, ttl_ms)
  local key = wake_prefix .. id
  redis.call('RPUSH', key, message)
  redis.call('PEXPIRE', key, ttl_ms)
  redis.call('SPUBLISH', wake_prefix, id)
end

-- Start every waiting entry that may start: a slot is free, its key conflicts with no
-- running entry and with no older entry that is still waiting. Each takes the lowest free
-- slot index and gets a fresh exec deadline (admission time + its exec budget). Granted
-- entries are saved and woken (but skip_id, whose caller is told directly); returns them.
local function grant(entries, now, slots, ke, wake_prefix, skip_id)
  local used, running, blocked, granted = {}, {}, {}, {}
  for _, e in ipairs(entries) do
    if e.st == 'r' then
      used[e.slot] = true
      running[#running + 1] = e
    end
  end
  local free = slots - #running
  for _, e in ipairs(entries) do
    if free <= 0 then
      break
    end
    if e.st == 'w' then
      local ok = true
      for _, r in ipairs(running) do
        if conflicts(e, r) then ok = false break end
      end
      if ok then
        for _, b in ipairs(blocked) do
          if conflicts(e, b) then ok = false break end
        end
      end
      if ok then
        local s = 0
        while used[s] do s = s + 1 end
        used[s] = true
        e.st, e.slot, e.ta, e.dl = 'r', s, now, now + e.xb
        free = free - 1
        running[#running + 1] = e
        granted[#granted + 1] = e
      else
        blocked[#blocked + 1] = e
      end
    end
  end
  for _, e in ipairs(granted) do
    if e.id ~= skip_id then
      e.wk = 1
    end
    redis.call('HSET', ke, e.id, cjson.encode(e))
    if e.id ~= skip_id then
      push_wake(wake_prefix, e.id, cjson.encode({t = 'grant', slot = e.slot, seq = e.seq, ta = e.ta, dl = e.dl}),
        e.dl - now + WAKE_TTL_MS)
    end
  end
  return granted
end

-- Every queue key lives as long as its longest-lived entry (plus a minute), never forever.
local function refresh_ttl(kq, ke, entries, now)
  local last = 0
  for _, e in ipairs(entries) do
    if e.dl > last then last = e.dl end
  end
  if last > 0 then
    redis.call('PEXPIRE', kq, last - now + WAKE_TTL_MS)
    redis.call('PEXPIRE', ke, last - now + WAKE_TTL_MS)
  end
end

local function slot_count(kreg, ceiling)
  local fields = redis.call('HMGET', kreg, 'slots', 'ceil')
  local slots = tonumber(fields[1]) or 0
  local ceil = tonumber(ceiling) or tonumber(fields[2]) or slots
  -- Remember the ceiling for scripts that run without one (a worker's settle), but never
  -- create a registration hash that has no TTL.
  if ceiling ~= nil and ceiling ~= '' and fields[1] then
    redis.call('HSET', kreg, 'ceil', ceiling)
  end
  return math.min(slots, ceil)
end

local function bump(kstats, field, ttl_ms)
  redis.call('HINCRBY', kstats, field, 1)
  redis.call('PEXPIRE', kstats, ttl_ms)
end
