-- lean_write.lua: the fast paths of the writes (compare_and_set; a finish or a
-- compare_and_set with the claim of the next run, one script), on lean.lua's terms: the
-- common case only, checked as the general code checks it, the same bytes written; nil for
-- anything else, before anything is written.

-- Whether key is absent or of type kind (a key the fast path writes but did not read).
local function lean_of(key, kind)
  local t = redis.call('TYPE', key)
  t = type(t) == 'table' and t.ok or t
  return t == kind or t == 'none'
end

-- The fast path of a write: a finish with a record (run_finish's ARGV at ARGV[b..]) or,
-- with cas, a compare_and_set (run_compare_and_set's) under Release, Hold or Fenced (the
-- lease kept, or with release). The run as the condition asks (for a fused write, one that
-- frees a held run: fused), at the revision named, not quarantined, nothing waiting on it,
-- its old wait and its new one no dependency or poll, the new one none or an At: due
-- WAKE_AHEAD ms ahead or more (no signal), or for a write alone due now too (a signal, as
-- place() sends it). Reads only: {k, h, record, run, held (its lease goes), keep (its lease
-- stays), rx (a free run's ready entry, which the write moves), ready_at and ready_ats (where
-- it enters READY, as a number and as text, or false), now_due (it is claimable now: a
-- signal), and for a session's run sid, sexp and sown (its session's id, expiry and owner,
-- as lean_session read them; '', false, false for a run of its own lease)}, or nil for the
-- general code.
local function lean_write(b, cas, fused)
  local run, expected, record, kind, owner, token, w
  if cas then
    run, expected, record, kind, owner = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3],
      ARGV[b + 4]
    token, w = ARGV[b + 5], b + 6
  else
    run, expected, owner, record, kind = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 5], 'F'
    token, w = ARGV[b + 3], b + 10
    if ARGV[b + 4] ~= 'w' or ARGV[b + 6] ~= '-' then return nil end
  end
  -- ('r' Release, 'h' Hold; 'f' and 'F' Fenced: the token where a Hold has its ttl, '0'.)
  local keep = kind == 'h' or kind == 'f'
  local fenced = kind == 'f' or kind == 'F'
  token = decimal(token, 0, MAX_INT)
  local wk, wa, wn, wdl, pv = ARGV[w], ARGV[w + 1], ARGV[w + 2], ARGV[w + 3], ARGV[w + 4]
  if not run or run == '' or #run > MAX_TEXT or not decimal(expected, 0, MAX_INT - 2)
      or not record or #record > MAX_RECORD_CEILING or not decimal(pv, 0, 2147483648)
      or not token or (wk ~= '' and wk ~= 'a') or (fused and keep)
      or not (kind == 'r' or ((keep or fenced) and owner and owner ~= ''
                              and #owner <= MAX_TEXT and (not fenced or token >= 1))) then
    return nil
  end
  local wait, waits = false, false
  if wk == 'a' then
    local at, deadline = decimal(wn, 0, MAX_INT), wdl == '' or decimal(wdl, 0, MAX_INT)
    if not at or not deadline or wa ~= '' then return nil end
    wait, waits = at, wn
    if deadline ~= true and deadline < wait then wait, waits = deadline, wdl end
  end
  if not lean_meta() then return nil end
  local k = P .. RUN_KEY .. run
  local len, _, _, rev, exp, tok, cdr, cat, rwk, _, _, _, _, _, tk, at, _, _, own, ck, _, lo,
    lc, sid = lean_run(k, true)
  if not len or rev ~= expected or #rev >= 15 or rwk == 'c' or rwk == 'p'
      or (own == '' and (kind ~= 'r' or fused))
      or (kind == 'h' and own ~= owner)
      or (fenced and (own ~= owner or tonumber(tok) ~= token))
      or redis.call('EXISTS', P .. DEPS_KEY .. run) == 1 then
    return nil
  end
  local sexp, sown = false, false
  if sid ~= '' then
    -- A session's run: only its holder's fenced release (a finish) leaves the session here
    -- (untold), while the session lives (its set's type: lean_two's to check).
    sexp, sown = lean_session(sid)
    if kind ~= 'F' or not sexp or sown ~= own or sexp <= now_ms() then return nil end
  end
  local now_due = false
  if wait and not keep then
    local ahead = wait - now_ms()
    now_due = ahead <= 0
    if ahead < WAKE_AHEAD and (fused or not now_due) then return nil end
  end
  -- write()'s header: the next revision, the new wait of this revision, no back-off; the
  -- lease, its token, its claim info and the counters kept (a checkpoint), or free, no
  -- claim info, counters from 0, the token kept.
  rev = int(tonumber(rev) + 1)
  local w5 = wait and 'a,' .. wn .. ',' .. wdl .. ',' .. rev .. ',' .. pv or ',,,,'
  local h
  if keep then
    h = rev .. ',' .. exp .. ',' .. tok .. ',' .. cdr .. ',' .. cat .. ',' .. w5 .. ',,' .. tk
      .. ',' .. at .. ',,,,' .. lo .. ',' .. lc .. ',0:' .. own .. ck
  else
    h = rev .. ',,' .. tok .. ',,,' .. w5 .. ',,,,,,,0,0,0:'
  end
  return {k = k, h = h, record = record, run = run, held = own ~= '' and not keep, sid = sid,
          sexp = sexp, sown = sown, keep = keep, rx = own == '' and rwk ~= '', ready_at = not keep and wait,
          ready_ats = waits, now_due = now_due}
end

-- Write what lean_write planned (the run first: a write the server refuses under
-- maxmemory, then its index entries), as write() and commit() would.
local function lean_finished(f)
  local record, h = f.record, f.h
  if #record <= 8192 then
    redis.call('SET', f.k, record .. h .. trailer(#h))
  else
    redis.call('SET', f.k, record)
    redis.call('SETRANGE', f.k, int(#record), h .. trailer(#h))
  end
  if f.held and f.sid ~= '' then
    redis.call('SREM', P .. SESSION_RUNS .. f.sid, f.run)  -- a session's run leaves it
  elseif f.held then
    redis.call('ZREM', LEASES, f.run)
  end
  if f.ready_at then
    redis.call('ZADD', READY, f.ready_ats, f.run)
  elseif f.rx then
    redis.call('ZREM', READY, f.run)
  end
end


-- The fast path of a write sent alone: compare_and_set's (cas: run_compare_and_set's ARGV,
-- the optional watch of another partition's dependency at ARGV[13]) or finish's
-- (run_finish's, the watch at ARGV[17]), with no such watch: the write as lean_write takes
-- it, the keys it writes of the types their commands need (the leases index, or a
-- session's set, which its run leaves: only a finish's run may be a session's), and its
-- signal as place() sends it: its reply, or nil.
local function lean_alone(cas)
  if ARGV[cas and 13 or 17] then return nil end
  local f = lean_write(2, cas, false)
  if not f or (f.held and f.sid == '' and not lean_of(LEASES, 'zset'))
      or (f.held and f.sid ~= '' and not lean_of(P .. SESSION_RUNS .. f.sid, 'set'))
      or ((f.ready_at or f.rx) and not lean_of(READY, 'zset')) then
    return nil
  end
  lean_finished(f)
  if f.now_due then add_tokens(WAKE_READY, {wake_token(f.run)}) end
  return {OK, false, 0, -1}
end

-- A fused script's fast path (run_finish_claim, run_cas_claim: cas), its first call's n
-- arguments at ARGV[3..] (n: that call's exact count, no watch of another partition's
-- dependency): the write that frees a run (lean_write), then a claim of the kind ARGV[n + 3]
-- names (lean_claim), both as their fast paths take them: its reply, {first's, claim's};
-- nil for the general code (nothing written).
local function lean_two(n, cas)
  local kind = ARGV[n + 3]
  if (kind ~= 'ready' and kind ~= 'leases' and kind ~= 'any') or ARGV[n + 12] then return nil end
  local f = lean_write(3, cas, true)
  if f and #f.record > MAX_FUSED_RECORD then return nil end  -- the claim goes alone
  local a = f and lean_claim_args(n + 4, f)
  local plan = a and lean_claim(kind, a, f.run, f.ready_at)
  if not plan then return nil end
  -- A finish of a session's run, and the same session's claim taking runs (a Worker's
  -- unit): the claim writes first, its SADD to the set the finish then leaves (a set of
  -- another type refuses it, nothing written), so that the set's type needs no read.
  local after = #plan.runs > 0 and f.sid ~= '' and a.sid == f.sid
  -- The keys written after the first write, of the types their commands need: the
  -- indexes the claim's pages read, or asked here; a session's set, asked here.
  if (kind == 'ready' and not lean_of(LEASES, 'zset'))
      or (kind == 'leases' and f.ready_at and not lean_of(READY, 'zset'))
      or (f.sid ~= '' and not after and not lean_of(P .. SESSION_RUNS .. f.sid, 'set'))
      or (a.sid and #plan.runs > 0 and a.sid ~= f.sid
          and not lean_of(P .. SESSION_RUNS .. a.sid, 'set')) then
    return nil
  end
  if after then
    local claimed = lean_take(kind, a, plan, false)
    if not claimed then return nil end
    lean_finished(f)
    return {{OK, false, 0, -1}, claimed}
  end
  lean_finished(f)
  return {{OK, false, 0, -1}, lean_take(kind, a, plan, true)}
end

