-- write.lua: the common end of insert and compare_and_set, and what a write does to a
-- quarantined run.

-- The fields of the discovered wait w, derived from s.rev at version pv, set in s. A poll
-- key's saved claim time survives while the key stays the same.
local function wait_fields(s, w, pv)
  if w.wk == '' then
    s.wk, s.wa, s.wn, s.wdl, s.pt = false, false, false, false, false
  else
    if w.wk ~= 'p' or s.wk ~= 'p' or s.wa ~= w.wa then s.pt = false end
    local wa = w.wa
    if w.wk == 'a' then wa = false end
    s.wk, s.wa, s.wn, s.wdl = w.wk, wa, w.wn, w.wdl
  end
  s.wrev, s.wpv = s.rev, pv
end

-- Save the discovered wait w as derived from s.rev at version pv, in s and in the
-- dependency index.
local function apply_wait(run, s, w, pv)
  -- A dependency in another partition: the version its watch read, before any decision.
  local rose = w.watched and raise_mirror(w.wa, w.watched, w.ws, w.wd)
  local was_dep = s.wk == 'c' and s.wa
  if was_dep and (w.wk ~= 'c' or was_dep ~= w.wa) then
    -- Its last waiter here leaving: the dependency's watch goes too (unwatch).
    local m = mirror_of(was_dep)
    if m and m.d and idle(was_dep, run) then unwatch(was_dep, m.d, m.s) end
    ix_rem(deps_ix(was_dep), run)
  end
  if w.wk == 'c' and was_dep ~= w.wa then ix_add(deps_ix(w.wa), run) end
  wait_fields(s, w, pv)
  -- The mirror rose: the other waiters of that dependency here read the new version too,
  -- re-indexed as a delivery would (which, finding the mirror up to date, does nothing).
  if rose then notify_dependents(w.wa, pv) end
end

-- A quarantined run written, released or restored leaves the quarantine; a poison one's
-- takeovers start again from 0, and one still held is indexed again. With counters (a write
-- that is not a checkpoint, restore) its takeovers and attempts start again too.
local function put_back(run, s, counters)
  if s.px then
    later('HDEL', QUARANTINE, (s.px == 'p' and 'poison|' or 'failed|') .. run)
    if s.px == 'p' then
      s.tk = 0
      if s.own then index_lease(run, s, s.exp) end
    end
    s.px = false
  end
  if counters then s.tk, s.at = 0, 0 end
end

-- The refusal of a write or delete under lease condition kind by owner (and, for Fenced,
-- its grant's token; for InSession, its session id), or nil. Only a Claim (or InSession)
-- over another owner's lease needs the clock. An InSession accepted as a Claim then needs
-- owner's live session: this script's grant goes under it (SESSION.join).
local function lease_refusal(s, kind, owner, token)
  if (kind == 'h' and s.own ~= owner)
      or ((kind == 'f' or kind == 'F') and (s.own ~= owner or s.tok ~= token))
      or ((kind == 'c' or kind == 'j') and s.own and s.own ~= owner and holder(s)[2] == 1) then
    return {REFUSED, holder(s), 0, -1}
  end
  if kind == 'j' then
    local sn, lapsed = SESSION.live(token, owner)
    if not sn then return lapsed end
    SESSION.join, SESSION.exp = token, sn.exp
  end
  return nil
end

-- The common end of insert, compare_and_set and a finish with a record: lease, wait,
-- one write, indexes. Every write clears not_before and puts a quarantined run back; a
-- checkpoint (kind 'h' or 'f': the lease stays) keeps its takeovers and attempts.
local function write(run, s, rev, record, kind, owner, ttl, w, pv)
  local code = s.rev and 'w' or 'i'  -- an insert's state is fresh(): no revision yet
  s.rev = rev
  -- From here on the run is this state for every read of the script: an insert's run was
  -- GONE, and a run waiting on itself must see its own new revision.
  SEEN[run] = s
  put_back(run, s, kind ~= 'h' and kind ~= 'f')
  s.nb = false
  apply_lease(run, s, kind, owner, ttl)
  apply_wait(run, s, w, pv)
  place(run, s, pv, false)
  save(run, s, record)
  feed_note(run, code, rev, owner)
  notify_dependents(run, pv)
  announce(run, 2 * rev)
end
