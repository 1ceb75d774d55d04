-- write.lua: the common end of insert and compare_and_set.

-- The fields of the discovered wait w, derived from s.rev at version pv, set in s. A poll
-- key's saved claim time survives while the key stays the same.
local function wait_fields(s, w, pv)
  if w.wk == '' then
    s.wk, s.wa, s.wn, s.wdl, s.pk, s.pt = false, false, false, false, false, false
  else
    if w.wk ~= 'p' then
      s.pk, s.pt = false, false
    elseif s.pk ~= w.wa then
      s.pk, s.pt = w.wa, false
    end
    local wa = w.wa
    if w.wk == 'a' then wa = false end
    s.wk, s.wa, s.wn, s.wdl = w.wk, wa, w.wn, w.wdl
  end
  s.wrev, s.wpv = s.rev, pv
end

-- Whether a new wait w leaves the run's dependency index as it is: no dependency before
-- and none now, or the same one (apply_wait changes no index then).
local function same_dependency(s, w)
  local was_dep = s.wk == 'c' and s.wa
  if w.wk == 'c' then return was_dep == w.wa end
  return not was_dep
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
    ix_rem(deps_ix(was_dep), run, 0)
  end
  if w.wk == 'c' and was_dep ~= w.wa then ix_add(deps_ix(w.wa), run, 0) end
  wait_fields(s, w, pv)
  -- The mirror rose: the other waiters of that dependency here read the new version too,
  -- re-indexed as a delivery would (which, finding the mirror up to date, does nothing).
  if rose then notify_dependents(w.wa, pv) end
end

-- A poison run written or released leaves the quarantine, its takeovers counted from 0; one
-- still held is indexed again (a Hold write or its own claim leaves the lease as it is).
local function put_back(run, s)
  if not s.px then return end
  later('HDEL', QUARANTINE, 'poison|' .. run)
  s.px, s.tk = false, 0
  if s.own then index_lease(run, s, s.exp) end
end

-- The refusal of a write or delete under lease condition kind by owner, or nil. Only a
-- Claim over another owner's lease needs the clock to decide.
local function lease_refusal(s, kind, owner)
  if (kind == 'h' and s.own ~= owner)
      or (kind == 'c' and s.own and s.own ~= owner and holder(s)[2] == 1) then
    return {REFUSED, holder(s), 0, -1}
  end
  return nil
end

-- A call that needs layout 3 (delete, max_takeovers) in a namespace below it: refused, so
-- that no library that knows only layout 2 meets what it cannot read.
local function needs_layout_3()
  if NS < 3 then return {TOO_OLD, NS, 0, -1} end
  return nil
end

-- The common end of insert and compare_and_set: lease, wait, one write, indexes.
local function write(run, s, rev, record, kind, owner, ttl, w, pv)
  local was_indexable = indexable(s) and true or false
  s.rev = rev
  -- From here on the run is this state for every read of the script: an insert's run was
  -- GONE, and a run waiting on itself must see its own new revision.
  SEEN[run] = s
  put_back(run, s)
  s.tk = 0
  apply_lease(run, s, kind, owner, ttl)
  apply_wait(run, s, w, pv)
  place(run, s, pv, false, was_indexable)
  save(run, s, record)
  notify_dependents(run, pv)
  announce(run, 2 * rev)
end
