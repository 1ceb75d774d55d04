-- sessions.lua: sessions, one owner's liveness lease holding many runs (docs/design/sessions.md).
--
-- SESSIONS (hash): id -> "expiry,ttl,cursor,owner"; SESSION_LEASES (zset): id -> expiry,
-- while the session is live or still has runs to put into LEASES once it lapsed;
-- P..SESSION_RUNS..id (set): the runs it holds; P..SESSION_TOLD..id (list): the runs others
-- took from it, for its next keepalive. A run held under a session records its id in its
-- header (sid) and has no LEASES entry of its own while the session lives: its lease is
-- live exactly while the session is, whatever its header's expiry says.

-- The session state and steps of a script, in one table (one local: a script that takes
-- runs under a session is near Lua's 200 locals): seen, the sessions read (id, decimal
-- text, -> {exp, ttl, cur, owner}, or false: absent or damaged, not live); join and exp,
-- the session a grant of this script takes its runs under (a session's claim, an InSession
-- write) and its expiry (false: none); left, how many runs this script took out of each
-- session's set; size, each such set's SCARD, read once before the first of them (before
-- any of this script's writes to it ran: a fused script commits its first part's before
-- its claim, so a count read again then would meet runs left counts twice).
local SESSION = {seen = {}, join = false, exp = false, left = {}, size = {}}

-- The session sid (decimal text) as stored, or false. Its record is sized before it is read,
-- and each field checked: a damaged one reads as absent (a lapsed session: its runs
-- expired, its keepalive refused), never as live.
function SESSION.of(sid)
  local got = SESSION.seen[sid]
  if got ~= nil then return got end
  got = false
  local n = redis.pcall('HSTRLEN', SESSIONS, sid)
  if type(n) == 'number' and n > 0 and n <= MAX_TEXT + 64 then
    local raw = redis.call('HGET', SESSIONS, sid)
    local exp, ttl, cur, pos = string.match(raw, '^(%d+),(%d+),(%d*),()')
    exp = exp and decimal(exp, 0, MAX_INT)
    ttl = ttl and decimal(ttl, 1, MAX_TTL)
    if exp and ttl and #cur <= 20 and pos <= #raw then
      got = {exp = exp, ttl = ttl, cur = cur, owner = string.sub(raw, pos)}
    end
  end
  SESSION.seen[sid] = got
  return got
end

-- The record of session sn (as SESSION.of reads it), queued.
function SESSION.save(sid, sn)
  SESSION.seen[sid] = sn
  later('HSET', SESSIONS, sid, int(sn.exp) .. ',' .. int(sn.ttl) .. ',' .. sn.cur .. ',' ..
    sn.owner)
end

-- The session sid of owner while it is live, or nil and the reply that refuses the call.
function SESSION.live(sid, owner)
  local sn = SESSION.of(sid)
  if not sn or sn.owner ~= owner or sn.exp <= now_ms() then
    return nil, {SESSION_LAPSED, sid, 0, -1}
  end
  return sn
end

-- A session id argument: 1 to 20 decimal digits (no leading zero), or '' for none (false).
function SESSION.arg(i)
  local s = ARGS[i] or ''
  if s ~= '' and (#s > 20 or not string.find(s, '^[1-9]%d*$')) then
    error('BADARG ARGV[' .. i .. '] must be empty or a session id')
  end
  return s ~= '' and s
end

-- Run (state s) leaves its session, if it has one: out of the session's set, and, when
-- told (another's call took it, and the session lives), onto its list for the next
-- keepalive. A lapsed session left without runs is gone.
function SESSION.leave(run, s, told)
  if not s.sid then return end
  local sid = int(s.sid)
  s.sid = false
  local set = P .. SESSION_RUNS .. sid
  later('SREM', set, run)
  local sn = SESSION.of(sid)
  if sn and sn.exp > now_ms() then
    if told then
      -- A told list of another type is set aside (deleted, listed in the quarantine as
      -- keepalive does) and a fresh one started: the run's write is not refused for it.
      local list = P .. SESSION_TOLD .. sid
      if not of_type(list, 'list') then
        later('DEL', list)
        later('HSET', QUARANTINE, 'session-told|' .. sid, 'type')
        TYPES[list] = 'none'
      end
      later('RPUSH', list, run)
    end
    return
  end
  SESSION.left[sid] = (SESSION.left[sid] or 0) + 1
  local n = SESSION.size[sid]
  if n == nil then
    n = redis.pcall('SCARD', set)
    SESSION.size[sid] = n
  end
  if type(n) == 'number' and n <= SESSION.left[sid] then
    later('HDEL', SESSIONS, sid)
    later('ZREM', SESSION_LEASES, sid)
    later('DEL', P .. SESSION_TOLD .. sid)
  end
end

-- The first entry of SESSION_LEASES (id, expiry), or nil (none, a key of another type, or
-- only lapsed sessions whose runs all went into LEASES, scored inf).
function SESSION.head()
  local h = redis.pcall('ZRANGE', SESSION_LEASES, 0, 0, 'WITHSCORES')
  if h.err or not h[1] then return nil end
  local at = tonumber(h[2])
  if not at or at > MAX_INT then return nil end
  return h[1], at
end

-- Before a claim walks LEASES: the runs of the lapsed sessions, first due first, SSCAN
-- steps of cap of them (one, and more while fewer than SESSION_SWEEP runs and
-- SESSION_SWEEP_BYTES of ids went in, over every session this claim sweeps; a session's
-- cursor kept in its record), go into LEASES due at their session's expiry, where the
-- claim (this one, and the next ones) meets them as any expired lease: a lapsed session
-- ahead holds back no other's runs. A session all of whose runs went in leaves
-- SESSION_LEASES; its record stays while it holds runs (their expiry). At most MAX_VISIT
-- sessions a claim. Written at once, before the claim reads LEASES: index upkeep that
-- changes no run, right whatever the claim then answers. An entry naming no session (or a
-- damaged one) goes, listed in the quarantine as "session|id".
function SESSION.sweep(cap)
  local spent = {runs = 0, bytes = 0}
  for _ = 1, MAX_VISIT do
    if not SESSION.sweep_first(cap, spent) or spent.runs >= SESSION_SWEEP
        or spent.bytes >= SESSION_SWEEP_BYTES then
      return
    end
  end
end

-- SESSION.sweep's step: the first lapsed session's runs, within what spent leaves. True
-- when that session is done with (all its runs in, or gone), so the next may follow.
function SESSION.sweep_first(cap, spent)
  local sid, at = SESSION.head()
  if not sid or at > now_ms() or not of_type(LEASES, 'zset') then return false end
  local id = string.find(sid, '^[1-9]%d*$') and #sid <= 20
  local sn = id and SESSION.of(sid)
  if not sn then
    redis.call('HSET', QUARANTINE, 'session|' .. sid, 'damaged')
    DROPPED = DROPPED + 1
    if not id or not of_type(SESSIONS, 'hash') then
      redis.call('ZREM', SESSION_LEASES, sid)
      return true
    end
    -- An id whose record is missing or damaged: a session lapsed at its entry's score (0
    -- for one below, a fraction cut off: a record SESSION.of reads), of
    -- an owner no longer known ('?'), so that the runs it holds are handed out (below, and
    -- at the next claims) as any lapsed session's, never stranded expired and unindexed.
    sn = {exp = at >= 0 and math.floor(at) or 0, ttl = 1, cur = '', owner = '?'}
    SESSION.seen[sid] = sn
    redis.call('HSET', SESSIONS, sid, int(sn.exp) .. ',1,,?')
  end
  if sn.exp > now_ms() then  -- a score behind its record's (a lost keepalive's ZADD)
    redis.call('ZADD', SESSION_LEASES, int(sn.exp), sid)
    return true
  end
  -- SSCAN steps of cap runs, one at least, more while the runs and their ids stay small.
  local set, cur, add, bytes = P .. SESSION_RUNS .. sid, sn.cur == '' and '0' or sn.cur, {},
    spent.bytes
  local exps = int(sn.exp)
  repeat
    local step = redis.pcall('SSCAN', set, cur, 'COUNT', cap)
    if step.err then
      redis.call('ZREM', SESSION_LEASES, sid)
      redis.call('HSET', QUARANTINE, 'session|' .. sid, 'type')
      DROPPED = DROPPED + 1
      return true
    end
    local runs = step[2]
    for i = 1, #runs do
      add[#add + 1] = exps
      add[#add + 1] = runs[i]
      bytes = bytes + #runs[i]
    end
    cur = step[1]
  until cur == '0' or spent.runs + #add / 2 >= SESSION_SWEEP or bytes >= SESSION_SWEEP_BYTES
  if #add > 0 then redis.call('ZADD', LEASES, unpack(add)) end
  spent.runs, spent.bytes = spent.runs + #add / 2, bytes
  if cur == '0' and #add == 0 and redis.call('SCARD', set) == 0 then
    -- Lapsed holding no run: gone (its record, its entry, its told list).
    redis.call('HDEL', SESSIONS, sid)
    redis.call('ZREM', SESSION_LEASES, sid)
    redis.call('DEL', P .. SESSION_TOLD .. sid)
  elseif cur == '0' then
    -- All in: out of the head (scored past every time), listed until its last run leaves.
    redis.call('ZADD', SESSION_LEASES, 'inf', sid)
  else
    sn.cur = cur
    redis.call('HSET', SESSIONS, sid, int(sn.exp) .. ',' .. int(sn.ttl) .. ',' .. sn.cur ..
      ',' .. sn.owner)
    return false
  end
  return true
end
