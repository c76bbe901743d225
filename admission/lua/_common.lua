-- Shared by every admission script (queue.py prepends this file to each of them).
--
-- A worker's queue is two keys: a ZSET (member: entry id, score: the entry's ticket, so
-- ZRANGE is arrival order) and a HASH (entry id -> JSON entry). An entry is waiting
-- (st = 'w', dl = its queue deadline) or running (st = 'r', dl = its exec deadline, slot).
-- Running entries stay in the queue and count toward WORKER_QUEUE_LIMIT until released.
-- Clock: ARGV now_ms when a test passes one, else Redis server TIME, so API hosts and
-- workers (whose clocks may differ) all see one clock.
--
-- The grant is the dispatch: an entry may come with its prepared assignment (a Celery
-- envelope in the worker's env HASH, entry id -> message). The script that grants it checks
-- the call against the registration (same incarnation; the workspace still offers what the
-- call needs, fields o:<workspace> of the reg HASH) and LPUSHes the envelope onto the
-- worker's Celery queue list in the same step, so no API process has to be alive for a
-- granted call to reach its worker. A durable call (du = 1) also has a status STRING
-- (ds:<entry id>) that every step of its life rewrites. See setup() for the keys.
-- A call entered with its caller's API key id (kid); a revoked key has a marker STRING
-- (<revoked prefix><key id>, written by the revocation, admission/revocation.py) and the
-- grant refuses its waiting calls instead of dispatching them.

local WAKE_TTL_MS = 60000
-- A grant pushed to a waiter that was blocked on its wake list is taken at once. One still
-- lying in the list this long after the grant means nobody is listening (the API process
-- died): the entry is dropped instead of holding its slot until its exec deadline.
local CLAIM_MS = 3000

-- Terminal statuses stay readable this long (contract §2.7: at least 10 minutes).
local STATUS_DONE_TTL_MS = 900000
local SEP = '\31'

-- Per-script dispatch context (setup() sets all but take, which settle.lua sets):
--   reg, q, env  the registration HASH, the queue ZSET, the env HASH (entry id -> envelope)
--   broker       the worker's Celery queue list; nil where this Redis cannot reach it (e.g.
--                a Redis Cluster): the waiting API process pushes the envelope itself
--   ds           status key prefix
--   rv           revoked-key marker prefix; '' = not checked here (the scripts do not
--                dispatch, e.g. on a Redis Cluster, whose marker lives in another slot): the
--                waiting API process checks the key in Postgres before it pushes the envelope
--   take         the caller (a worker thread that just settled) runs the first granted
--                envelope itself instead of it going through the Celery queue (D.taken and
--                D.taken_entry, returned to it)
local D = {
  reg = nil, q = nil, env = nil, broker = nil, ds = '', rv = '', take = false, taken = nil,
  taken_entry = nil,
}

local function setup(kreg, kq, kenv, kbroker, ds_prefix, revoked_prefix)
  D.reg, D.q, D.env, D.broker, D.ds = kreg, kq, kenv, kbroker, ds_prefix or ''
  D.rv = revoked_prefix or ''
end

local function clock_ms(arg)
  if arg ~= nil and arg ~= '' and arg ~= '0' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Two entries conflict when their keys do (a lane with itself and with its checkout), unless
-- both only read (rd = 1): reads never change a workspace, so they share it. A write waiting
-- behind running reads still holds back every later read (the key rule in grant), so a
-- stream of reads cannot starve it.
local function conflicts(a, b)
  if a.rd == 1 and b.rd == 1 then
    return false
  end
  return a.base == b.base and (a.lane == '' or b.lane == '' or a.lane == b.lane)
end

-- Fair share across flows (a flow: the principal that made the call, entry field fl). Each
-- entry gets a virtual start tag (vt) as it enters: the smallest tag still waiting (else the
-- largest in the queue), or one past its own flow's newest tag when that is later. Waiting
-- entries are granted in (tag, ticket) order, so flows take turns, a flow's own calls keep
-- their arrival order, and a newcomer lands behind every entry already at its tag: the
-- first waiting entry is never passed by a later arrival, only held by running conflicts.
local function fair_tag(entries, fl)
  local least, most, own = nil, 0, nil
  for _, e in ipairs(entries) do
    local t = e.vt or 0
    if e.st == 'w' and (least == nil or t < least) then least = t end
    if t > most then most = t end
    if (e.fl or '') == fl and (own == nil or t > own) then own = t end
  end
  local v = least or most
  if own ~= nil and own + 1 > v then
    return own + 1
  end
  return v
end

local function fair_before(a, b)
  local ta, tb = a.vt or 0, b.vt or 0
  if ta ~= tb then
    return ta < tb
  end
  return a.seq < b.seq
end

local function remove_entry(kq, ke, id)
  redis.call('ZREM', kq, id)
  redis.call('HDEL', ke, id)
  if D.env then
    redis.call('HDEL', D.env, id)
  end
end

-- A durable call's status (contract §2.7), and that of a synchronous call whose completion
-- row draft waits in Redis (rw = 1, copied into the status), from which the drainer's sweep
-- writes the row if the call's API process died. Live states last until the entry's deadline
-- plus the terminal TTL; terminal ones STATUS_DONE_TTL_MS. After entry, a synchronous call's
-- status is only overwritten (XX): once its process wrote the row it deleted the status, and
-- a late step (the call's settlement after a 504) must not create it again.
local function set_status(e, state, extra, now)
  if (e.du ~= 1 and e.rw ~= 1) or D.ds == '' then
    return
  end
  local s = {state = state, dl = e.dl, seq = e.seq, t0 = e.t0}
  if e.slot ~= nil then s.slot = e.slot end
  if e.ta ~= nil then s.ta = e.ta end
  if e.oo == 1 then s.oo = 1 end
  if e.rw == 1 then s.rw = 1 end
  if extra then
    for k, v in pairs(extra) do s[k] = v end
  end
  local ttl = STATUS_DONE_TTL_MS
  if state == 'queued' or state == 'admitted' then
    ttl = e.dl - now + STATUS_DONE_TTL_MS
  end
  if e.du == 1 or state == 'queued' then
    redis.call('SET', D.ds .. e.id, cjson.encode(s), 'PX', ttl)
  else
    redis.call('SET', D.ds .. e.id, cjson.encode(s), 'PX', ttl, 'XX')
  end
end

local function fail_status(e, code, now)
  set_status(e, 'failed', {code = code}, now)
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
      remove_entry(kq, ke, id)
      if unclaimed then
        redis.call('DEL', wake_prefix .. id)
      end
      if e ~= nil then
        -- Past its queue deadline while waiting: not started. Past its exec deadline while
        -- running: outcome unknown.
        fail_status(e, e.st == 'w' and 'WORKSPACE_QUEUE_TIMEOUT' or 'ASSIGNMENT_EXPIRED', now)
      end
    else
      entries[#entries + 1] = e
    end
  end
  return entries
end

-- The list keeps the message; the announcement on the worker's shard channel (the wake
-- prefix itself: same hash tag, so same slot as every key here) wakes the API process that
-- waits for it (admission/waiters.py): sharded pub/sub on Redis 7, plain pub/sub on 6.2.
local function push_wake(wake_prefix, id, message, ttl_ms)
  local key = wake_prefix .. id
  redis.call('RPUSH', key, message)
  redis.call('PEXPIRE', key, ttl_ms)
  -- Redis 6.2 has no sharded pub/sub (the reader then uses plain SUBSCRIBE): PUBLISH there.
  local sent = redis.pcall('SPUBLISH', wake_prefix, id)
  if type(sent) == 'table' and sent.err then
    redis.call('PUBLISH', wake_prefix, id)
  end
end

-- Whether this call may still be granted: its caller's key is not revoked, the registration
-- is the incarnation it entered under, and the workspace's offer (reg field o:<workspace>,
-- SEP-delimited tokens) covers what it needs. Returns nil, or the refusal code
-- (UNAUTHENTICATED: the key was revoked while the call waited; WORKER_OFFLINE: a waiting
-- call never moves to a replacement incarnation; WORKER_MISMATCH: the offer was withdrawn).
-- `seen` keeps what one pass has read (`revoked` by marker key, `offer` by workspace), so a
-- queue of one caller's calls on one workspace costs two reads, not two per call.
local function refusal_of(e, inc, seen)
  -- pcall: a worker's Redis user (settle) may read the markers only where Redis has
  -- read-only key patterns (7 and later); on 6.2 it cannot, and its grants go unchecked
  -- rather than failing the settlement (docs/admission.md).
  if e.kid ~= nil and D.rv ~= '' then
    local marker = D.rv .. e.kid
    local revoked = seen.revoked[marker]
    if revoked == nil then
      revoked = redis.pcall('EXISTS', marker) == 1
      seen.revoked[marker] = revoked
    end
    if revoked then
      return 'UNAUTHENTICATED'
    end
  end
  if e.inc ~= inc then
    return 'WORKER_OFFLINE'
  end
  if e.nd == nil then
    return nil
  end
  local offer = seen.offer[e.ws]
  if offer == nil then
    offer = redis.call('HGET', D.reg, 'o:' .. e.ws)
    seen.offer[e.ws] = offer
  end
  if not offer then
    return 'WORKER_MISMATCH'
  end
  for _, tok in ipairs(e.nd) do
    if not string.find(offer, SEP .. tok .. SEP, 1, true) then
      return 'WORKER_MISMATCH'
    end
  end
  return nil
end

-- A drained worker (manage.py drain_worker, admission/operator.py) grants nothing: running
-- calls finish, waiting ones keep their places and deadlines until it is resumed. Its flag is
-- the key beside reg, under the same hash tag (so in the same cluster slot): <tag>:drain.
local function drained()
  return redis.call('EXISTS', string.sub(D.reg, 1, -4) .. 'drain') == 1
end

-- The wake-up message that tells a waiting call why it was refused.
local REFUSED_KIND = {
  UNAUTHENTICATED = 'revoked', WORKER_OFFLINE = 'offline', WORKER_MISMATCH = 'mismatch',
}

-- The one place a script dispatches a granted call: its envelope goes onto the worker's
-- Celery queue list, or, for the first one when D.take is set, to the settling worker thread,
-- which runs it next (D.taken: a same-worker handoff skips the broker hop). False when this
-- script cannot reach the broker (a Redis Cluster) or the call has no envelope: its waiting
-- API process then pushes it (admission/services.py).
local function dispatch(e)
  local envelope = D.env and D.broker and redis.call('HGET', D.env, e.id) or nil
  if not envelope then
    return false
  end
  if D.take and D.taken == nil then
    D.taken = envelope
    -- And its entry as the grant saves it: the settler reads its grant from it, not from Redis.
    D.taken_entry = e
  else
    redis.call('LPUSH', D.broker, envelope)
  end
  redis.call('HDEL', D.env, e.id)
  e.dp = 1
  return true
end

-- Start every waiting entry that may start, taken in fair order (fair_before): a slot is
-- free, its key conflicts with no running entry and with no entry before it in that order
-- that is still waiting. A grant made while an older entry (by ticket) still waits is marked
-- out of arrival order (oo = 1; the completion row records it). Each takes the lowest free
-- slot index and gets a fresh exec deadline (admission time + its exec budget). A waiting
-- entry the registration no longer takes is refused (removed, told, status failed) on the
-- way. Each granted entry is dispatched (dispatch()); one that could not be must be pushed
-- and its grant claimed by its waiter (wk = 1).
-- Granted entries are saved and woken (but skip_id, whose caller is told directly).
local function grant(entries, now, slots, ke, wake_prefix, skip_id)
  local used, running, blocked, granted = {}, {}, {}, {}
  local inc = redis.call('HGET', D.reg, 'inc')
  local kept, seen = {}, {revoked = {}, offer = {}}
  for _, e in ipairs(entries) do
    local refused = e.st == 'w' and refusal_of(e, inc, seen) or nil
    if refused then
      remove_entry(D.q, ke, e.id)
      local kind = REFUSED_KIND[refused]
      push_wake(wake_prefix, e.id, cjson.encode({t = kind}), WAKE_TTL_MS)
      fail_status(e, refused, now)
      e.refused = refused
    else
      kept[#kept + 1] = e
    end
  end
  if drained() then
    return granted
  end
  for _, e in ipairs(kept) do
    if e.st == 'r' then
      used[e.slot] = true
      running[#running + 1] = e
    end
  end
  local free = slots - #running
  local waiting = {}
  for _, e in ipairs(kept) do
    if e.st == 'w' then waiting[#waiting + 1] = e end
  end
  table.sort(waiting, fair_before)
  for _, e in ipairs(waiting) do
    if free <= 0 then
      break
    end
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
  local oldest = nil
  for _, e in ipairs(waiting) do
    if e.st == 'w' and (oldest == nil or e.seq < oldest) then oldest = e.seq end
  end
  for _, e in ipairs(granted) do
    if oldest ~= nil and oldest < e.seq then e.oo = 1 end
    if not dispatch(e) and e.id ~= skip_id then
      e.wk = 1
    end
    redis.call('HSET', ke, e.id, cjson.encode(e))
    set_status(e, 'admitted', nil, now)
    if e.id ~= skip_id then
      push_wake(wake_prefix, e.id,
        cjson.encode({t = 'grant', slot = e.slot, seq = e.seq, ta = e.ta, dl = e.dl, dp = e.dp or 0,
          oo = e.oo or 0}),
        e.dl - now + WAKE_TTL_MS)
    end
  end
  return granted
end

-- The capacity share, for a call of flow `fl` about to enter: while more than one flow is in
-- the queue (the newcomer included), no flow holds more than `cap` entries. A flow alone may
-- fill the whole queue; when another arrives, the flows above the cap lose their newest
-- waiting entries down to it, and while the queue is still full the newcomer takes the place
-- of the newest waiting entry of the flow that holds the most (at least two more than the
-- newcomer's flow). An entry so removed was never started: its waiter is told 'full'. A
-- share of 100 % turns all this off (the queue is first come, first served).
-- Returns the entries left, and whether the call itself is refused (its flow is at its cap).
local function share_room(entries, fl, cap, limit, now, ke, wake_prefix)
  if cap >= limit then
    return entries, false  -- a share of the whole queue: no sharing at all
  end
  local held, flows = {}, 0
  for _, e in ipairs(entries) do
    local f = e.fl or ''
    if held[f] == nil then
      held[f], flows = 0, flows + 1
    end
    held[f] = held[f] + 1
  end
  if held[fl] == nil then
    held[fl], flows = 0, flows + 1
  end
  if flows < 2 then
    return entries, false
  end
  if held[fl] >= cap then
    return entries, true
  end
  local gone, total = {}, #entries
  local function drop(e)
    gone[e.id] = true
    held[e.fl or ''] = held[e.fl or ''] - 1
    total = total - 1
    remove_entry(D.q, ke, e.id)
    push_wake(wake_prefix, e.id, cjson.encode({t = 'full', cap = cap}), WAKE_TTL_MS)
    fail_status(e, 'WORKER_QUEUE_FULL', now)
  end
  for i = #entries, 1, -1 do
    local e = entries[i]
    if e.st == 'w' and held[e.fl or ''] > cap then drop(e) end
  end
  while total >= limit do
    local victim = nil
    for i = #entries, 1, -1 do
      local e = entries[i]
      local f = e.fl or ''
      if e.st == 'w' and not gone[e.id] and f ~= fl and held[f] > held[fl] + 1
          and (victim == nil or held[f] > held[victim.fl or '']) then
        victim = e
      end
    end
    if victim == nil then break end
    drop(victim)
  end
  local left = {}
  for _, e in ipairs(entries) do
    if not gone[e.id] then left[#left + 1] = e end
  end
  return left, false
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
    if D.env then
      redis.call('PEXPIRE', D.env, last - now + WAKE_TTL_MS)
    end
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
