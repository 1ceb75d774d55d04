-- taking.lua: the steps of a claim that hands out runs: the ready index's, the expired
-- leases', and the re-indexing a ready claim goes on with first.

-- Go on with the re-indexing of the first dependency whose waiters are still to be placed
-- (up to MAX_CLAIM_FANOUT of them), as every claim of the ready index does first. Returns
-- whether more is pending after this call, or nil and an error reply (nothing written).
local function reindex_first(pv)
  -- Read at once, not typed first: a key of another type answers an error instead.
  local queued = redis.pcall('ZRANGE', FANOUT, 0, 1)
  if queued.err then
    wrong_type(queued)
    return nil, {CORRUPT, 'index:fanout', 0, -1}
  end
  TYPES[FANOUT], READ[FANOUT] = queued[1] and 'zset' or 'none', true
  local pending, more_pending = queued[1], queued[2] ~= nil
  if pending and not index_intact(deps_ix(pending)) then
    -- Its waiters' set was replaced by another type: nothing to re-index, never a wall.
    later('ZREM', FANOUT, pending)
    later('HDEL', FANOUT_CURSOR, pending)
    later('HSET', QUARANTINE, 'fanout|' .. pending, 'type')
    DROPPED = DROPPED + 1
  elseif pending then
    if not of_type(FANOUT_CURSOR, 'hash') then
      return nil, {CORRUPT, 'index:fanout-cursor', 0, -1}
    end
    -- A cursor is sized before it is read; a damaged one starts the set over.
    local cursor = '0'
    if redis.call('HSTRLEN', FANOUT_CURSOR, pending) <= 20 then
      cursor = redis.call('HGET', FANOUT_CURSOR, pending) or '0'
      if not string.find(cursor, '^%d+$') then cursor = '0' end
    end
    cursor = fan_out(pending, cursor, pv, MAX_CLAIM_FANOUT)
    more_pending = more_pending or cursor ~= '0'
    if cursor == '0' then
      later('ZREM', FANOUT, pending)
      later('HDEL', FANOUT_CURSOR, pending)
    else
      later('HSET', FANOUT_CURSOR, pending, cursor)
    end
  end
  return more_pending
end

-- The claim's reply entry for run: its id, or {run, current} with records (rec).
local function hand_out(out, run, s, budget, rec)
  if budget > 0 then out[#out + 1] = {run, current(s, rec)} else out[#out + 1] = run end
end

-- One due entry of READY, met by a claim: claimed for owner when the run says it is
-- eligible now, re-scored when later, dropped when not at all. True when the claim stops
-- here (its records would pass budget; strict: the first run too must fit).
local function take_ready(run, s, owner, ttl, now, pv, budget, strict, out)
  local t = eligible_at(s, pv)
  if t == nil then
    ix_rem(READY_IX, run)
    s.rx = false
  elseif t > now then
    put(READY_IX, run, t)
  else
    local rec = budget > 0 and claimed_record(run, s, budget, #out + strict, READY_IX)
    if rec == nil then return true end
    if budget == 0 or rec then
      grant(run, s, owner, now + ttl)
      s.ck, s.cdr, s.cat = '', false, now
      if s.wk == 'c' then
        s.ck, s.cdr = s.wa, dep_revision(s.wa)
      elseif s.wk == 'p' then
        s.ck, s.pt = s.wa, now
      end
      ix_rem(READY_IX, run)
      s.rx = false
      save(run, s)
      feed_note(run, 'c', s.rev, owner)
      hand_out(out, run, s, budget, rec)
    end
  end
  return false
end

-- One due entry of LEASES, met by a claim: claimed for owner when the run's own lease has
-- expired (a lost try: attempts + 1; from another owner, a takeover), re-scored when it was
-- extended, dropped when the run is free or poison, quarantined as poison when bound (max
-- takeovers) says so. True when the claim stops here, as take_ready.
local function take_expired(run, s, owner, ttl, now, bound, budget, strict, out)
  if not s.own or s.px == 'p' then
    ix_rem(LEASES_IX, run)
  elseif s.exp > now then
    put(LEASES_IX, run, s.exp)
  elseif s.own ~= owner and bound and s.tk >= bound then
    -- A poison run: out of every claim until a write, a release or restore puts it back.
    ix_rem(LEASES_IX, run)
    later('HSET', QUARANTINE, 'poison|' .. run, 'takeovers=' .. int(s.tk))
    DROPPED = DROPPED + 1
    s.px, s.lx = 'p', false
    save(run, s)
    feed_note(run, 'q', s.rev, owner)
  else
    local rec = budget > 0 and claimed_record(run, s, budget, #out + strict, LEASES_IX)
    if rec == nil then return true end
    if budget == 0 or rec then
      local code = s.own ~= owner and 't' or 'c'
      if s.own ~= owner and s.tk < MAX_TAKEOVERS then s.tk = s.tk + 1 end
      if s.at < MAX_TAKEOVERS then s.at = s.at + 1 end
      grant(run, s, owner, now + ttl)
      save(run, s)
      feed_note(run, code, s.rev, owner)
      hand_out(out, run, s, budget, rec)
    end
  end
  return false
end
