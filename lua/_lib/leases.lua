-- leases.lua: who holds a run, when it is ready, and the lease index.

-- Lease holder as the reply shape {owner|false, live 0|1}. Expiry == now is expired.
local function holder(s)
  if not s.own then return {false, 0} end
  if s.exp > now_ms() then return {s.own, 1} end
  return {s.own, 0}
end

-- A run as read: the reply shape of run_get and of each run a claim with records hands
-- back: {revision, record, owner|false, live 0|1, claim_key|false, claim_dep_rev|'',
-- claimed_at|false, takeovers, token|false, attempts, not_before|false, quarantined ''|'p'|'f',
-- session id|false}.
local function current(s, rec)
  local h = holder(s)
  return {s.rev, rec, h[1], h[2], s.cat and s.ck or false, opt_text(s.cdr), s.cat or false,
          s.tk, s.own and s.tok or false, s.at, s.nb or false, s.px or '',
          s.sid and int(s.sid) or false}
end

-- Record bytes handed back so far by this claim.
local SPENT = 0

-- A claim with records (budget > 0 bytes, at most MAX_CLAIM_BYTES) hands back each claimed
-- run's record: the record of run, or nil when it would take the claim past budget after
-- taken runs (the claim stops before it: the first run always goes), or false when it is
-- longer than any record a store writes (planted), quarantined from index ix unread.
local function claimed_record(run, s, budget, taken, ix)
  if s.len > MAX_RECORD_CEILING then
    quarantine(ix, run, 'record')
    return false
  end
  if taken > 0 and SPENT + s.len > budget then return nil end
  SPENT = SPENT + s.len
  return record_of(run, s)
end

-- Backend time from which the run in state s is eligible for claim_ready, or nil when it is
-- not (held, no wait, stale metadata, quarantined, or waiting for a dependency to change).
-- Immediate triggers (an unseen or changed dependency, a poll key seen for the first time)
-- count from now; a failed try's not_before holds it back.
local function eligible_at(s, pv)
  if s.own or not s.wk or s.wrev ~= s.rev or s.wpv < pv or s.px then
    return nil
  end
  local t = nil
  if s.wk == 'a' then
    t = s.wn
  elseif s.wk == 'p' then
    if s.pt then t = s.pt + s.wn else t = now_ms() end
  else
    if s.wn == false or dep_revision(s.wa) ~= s.wn then t = now_ms() end
  end
  if s.wdl and (t == nil or s.wdl < t) then t = s.wdl end
  if t and s.nb and s.nb > t then t = s.nb end
  return t
end

-- After a claim's writes: how long until index ix has a claimable entry, in ms (0: one is
-- due now, or pending is true: work is left; -1: nothing), and its wake key (key) told so,
-- as advice: with work left after a claim that took some, one token "~more", so that
-- another blocked claimer takes the rest (one member: the key never grows by it); with
-- nothing indexed, no token of it means anything any more: they go (a claim never
-- takes the tokens of the runs it takes, which would cost it a call each time; a token of
-- a run due later, earlier than the head, stays: it tells the blocked claimers the new due
-- time). The entry
-- after those the claim visited (due's ix.after) and those this script put back (ix.low)
-- answer without a read, unless a page ended there.
local function wait_after_claim(key, ix, took, pending)
  local now = now_ms()
  local run, t
  local after = ix.after
  if after == nil or after == true then
    run, t = ix_head(ix)
  elseif after then
    run, t = after[1], after[2]
  end
  if ix.low and (not t or ix.low < t) then run, t = ix.lowrun, ix.low end
  local wait = -1
  if pending or (t and t <= now) then
    wait = 0
  elseif t and t <= MAX_INT then
    wait = math.ceil(t) - now
  end
  if wait < 0 then
    redis.pcall('ZREMRANGEBYRANK', key, 0, -1)  -- a key of another type: left as it is
  elseif wait == 0 and took > 0 then
    redis.pcall('ZADD', key, 'NX', now, '~more')
    if PARTITION then redis.pcall('SPUBLISH', key, '1') end
  end
  return wait
end

-- READY scores as planned by this script (false: removed).
local PLACED = {}

-- Put run into scored index ix at score t (queued), noting the earliest so put (ix.low).
local function put(ix, run, t)
  ix_add(ix, run, t)
  if not ix.low or t < ix.low then ix.low, ix.lowrun = t, run end
end

-- Put run where it belongs in READY after a write of its own (its time is recomputed) or of
-- its dependency (dep_write: a run already eligible keeps its earlier time, so runs are
-- ordered by when their wait became due). s.rx says whether READY may hold it.
local function place(run, s, pv, dep_write)
  local t = eligible_at(s, pv)
  if t and t > MAX_INT then t = MAX_INT end  -- a poll time past MAX_INT: stored, and read back
  if t == nil then
    if s.rx then ix_rem(READY_IX, run) end
    PLACED[run], s.rx = false, false
    return
  end
  if dep_write and t == now_ms() then
    local old = PLACED[run]
    if old == nil and s.rx and of_type(READY, 'zset') then
      old = tonumber(redis.call('ZSCORE', READY, run))
    end
    if old and old <= t then return end
  end
  put(READY_IX, run, t)
  PLACED[run], s.rx = t, true
  signal(WAKE_READY, READY_IX, run, t)
end

-- Claim info belongs to the owner whose ready claim made it: it goes with the lease.
local function drop_claim(s)
  s.ck, s.cdr, s.cat = false, false, false
end

-- Index run's lease, expiring at exp.
local function index_lease(run, s, exp)
  put(LEASES_IX, run, exp)
  s.lx = exp
  signal(WAKE_LEASES, LEASES_IX, run, exp)
end

-- Grant run's lease to owner until exp, under the next token (the caller saves s); under
-- the session this script grants under, if any (SESSION.join: the run joins its set, with
-- no LEASES entry of its own, and its expiry is the session's). A run taken from another
-- session leaves it (told).
local function grant(run, s, owner, exp)
  if s.own ~= owner then drop_claim(s) end
  local join = SESSION.join
  if s.sid and int(s.sid) ~= join then SESSION.leave(run, s, true) end
  s.own, s.tok = owner, s.tok + 1
  if not join then
    s.exp = exp
    index_lease(run, s, exp)
    return
  end
  if s.lx then
    ix_rem(LEASES_IX, run)
    s.lx = false
  end
  if not s.sid then later('SADD', P .. SESSION_RUNS .. join, run) end
  s.sid, s.exp = tonumber(join), SESSION.exp
end

-- Free run's lease (the caller saves s); a session's run leaves it, told unless its holder
-- freed it under its grant (told false).
local function free(run, s, told)
  if not s.own then return end
  drop_claim(s)
  if s.lx then ix_rem(LEASES_IX, run) end
  SESSION.leave(run, s, told)
  s.own, s.exp, s.lx = false, false, false
end

-- The lease condition's effect on s: 'c'/'s' grant it to owner for ttl, 'j' under the
-- session SESSION.join, 'r' and 'F' free it, 'h' and 'f' leave it.
local function apply_lease(run, s, kind, owner, ttl)
  if kind == 'c' or kind == 's' or kind == 'j' then
    grant(run, s, owner, now_ms() + ttl)
  elseif kind == 'r' or kind == 'F' then
    free(run, s, kind == 'r')
  end
end
