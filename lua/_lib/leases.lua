-- leases.lua: who holds a run, when it is ready, and the lease index.

-- Lease holder as the reply shape {owner|false, live 0|1}. Expiry == now is expired.
local function holder(s)
  if not s.own then return {false, 0} end
  if s.exp > now_ms() then return {s.own, 1} end
  return {s.own, 0}
end

-- A run as read: the reply shape of run_get and of each run a claim with records hands
-- back: {revision, record, owner|false, live 0|1, claim_key|false, claim_dep_rev|'',
-- claimed_at|false}.
local function current(s, rec)
  local h = holder(s)
  return {s.rev, rec, h[1], h[2], s.ck or false, opt_text(s.cdr), s.cat or false, s.tk}
end

-- Record bytes handed back so far by this claim.
local SPENT = 0

-- A claim with records (budget > 0 bytes, at most MAX_CLAIM_BYTES) hands back each claimed
-- run's record: the record of run, or nil when it would take the claim past budget after
-- taken runs (the claim stops before it: the first run always goes), or false when the
-- record is missing (a damaged layout 1 run), quarantined from index ix.
-- The size is checked before the record is read: a record that does not fit costs nothing.
local function claimed_record(run, s, budget, taken, ix)
  local size = s.len
  if s.v == 1 then
    size = nil
    if redis.call('HEXISTS', run_key(run), 'rec') == 1 then
      size = redis.call('HSTRLEN', run_key(run), 'rec')
    end
  end
  if size == nil then
    quarantine(ix, run, 'rec')
    return false
  end
  if taken > 0 and SPENT + size > budget then return nil end
  SPENT = SPENT + size
  return record_of(run, s)
end

-- READY may hold a run only while it is free and has a wait.
local function indexable(s)
  return (not s.own) and s.wk
end

-- Backend time from which the run in state s is eligible for claim_ready, or nil when it is
-- not (held, no wait, stale metadata, or waiting for a dependency to change). Immediate
-- triggers (an unseen or changed dependency, a poll key seen for the first time) count
-- from now.
local function eligible_at(s, pv)
  if s.own or not s.wk or s.wrev ~= s.rev or s.wpv < pv then
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
  return t
end

-- After a claim's writes: how long until index has a claimable entry, in ms (0: one is due
-- now, or pending is true: work is left; -1: nothing), and, when work is left and the
-- claim took some, one token added so that another blocked claimer takes the rest (as
-- advice, like every signal).
local function wait_after_claim(key, ix, took, pending)
  local now = now_ms()
  local run, t = ix_head(ix)
  local wait = -1
  if pending or (t and t <= now) then
    wait = 0
  elseif t and t <= MAX_INT then
    wait = math.ceil(t) - now
  end
  if wait == 0 and took > 0 and run then add_tokens(key, {wake_token(run)}) end
  return wait
end

-- READY scores as planned by this script (false: removed).
local PLACED = {}

-- Put run where it belongs in READY after a write of its own (its time is recomputed) or of
-- its dependency (dep_write: a run already eligible keeps its earlier time, so runs are
-- ordered by when their wait became due). was_indexable false: the run was held or had no
-- wait before this write, so READY holds no entry of it to remove (a stray one, written by
-- hand, is dropped by the next claim_ready that meets it). From layout 4 the run's state
-- keeps its score (rt), which finds its entry: the caller saves s after.
local function place(run, s, pv, dep_write, was_indexable)
  local t = eligible_at(s, pv)
  if t and t > MAX_INT then t = MAX_INT end  -- a poll time past MAX_INT: stored, and read back
  if t == nil then
    if was_indexable ~= false or s.rx then ix_rem(READY_IX, run, s.rx) end
    PLACED[run], s.rt = false, false
    return
  end
  if dep_write and t == now_ms() then
    local old = PLACED[run]
    if old == nil and s.rt then
      old = s.rt
    elseif old == nil and (NS < 4 or OLD_IX) and of_type(READY, 'zset') then
      old = tonumber(redis.call('ZSCORE', READY, run))
    end
    if old and old <= t then
      -- Kept where it is; from layout 4 put there again, in case its entry was lost.
      if NS >= 4 and PLACED[run] == nil and s.rt then ix_add(READY_IX, run, old, s.rx) end
      return
    end
  end
  ix_add(READY_IX, run, t, s.rx)
  PLACED[run], s.rt = t, t
  signal(WAKE_READY, READY_IX, run, t)
end

-- Claim info belongs to the owner whose ready claim made it: it goes with the lease.
local function drop_claim(s)
  s.ck, s.cdr, s.cat = false, false, false
end

-- Index run's lease, expiring at exp.
local function index_lease(run, s, exp)
  ix_add(LEASES_IX, run, exp, s.lx)
  signal(WAKE_LEASES, LEASES_IX, run, exp)
end

-- Hand run's lease to owner until exp (the caller saves s).
local function hold(run, s, owner, exp)
  if s.own ~= owner then drop_claim(s) end
  s.own, s.exp = owner, exp
  index_lease(run, s, exp)
end

-- The lease condition's effect on s: 'c'/'s' hand it to owner for ttl, 'r' frees it,
-- 'h' leaves it.
local function apply_lease(run, s, kind, owner, ttl)
  if kind == 'c' or kind == 's' then
    hold(run, s, owner, now_ms() + ttl)
  elseif kind == 'r' and s.own then
    drop_claim(s)
    s.own, s.exp = false, false
    ix_rem(LEASES_IX, run, s.lx)
  end
end
