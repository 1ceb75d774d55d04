-- fanout.lua: re-indexing the runs that wait for a run that was written.

-- A waiter w met by a fan-out over ix: placed in READY (its state saved when its ready
-- score changes nothing in its header), or dropped from ix when missing, quarantined when
-- corrupt.
local function fan_out_one(ix, w, pv)
  local ws, bad = load(w)
  if ws then
    if not ws.own and ws.wk then place(w, ws, pv, true) end
  elseif ws == nil then
    ix_rem(ix, w)
  else
    quarantine(ix, w, bad)
  end
end

-- How many waiters this script's fan-outs visited (a fused script's claim goes alone after
-- a first call that re-indexed any: two_ops).
local FANNED = 0

-- Re-index up to cap (MAX_FANOUT when nil) waiters of dep from cursor (an SSCAN cursor of
-- its waiters' set); returns the next cursor ('0' when every waiter was visited).
local function fan_out(dep, cursor, pv, cap)
  cap = cap or MAX_FANOUT
  local ix = deps_ix(dep)
  if not of_type(ix.key, 'set') then return '0' end
  local visited = 0
  repeat
    local page = redis.call('SSCAN', ix.key, cursor, 'COUNT', math.min(100, cap))
    cursor = page[1]
    for _, w in ipairs(page[2]) do
      fan_out_one(ix, w, pv)
      visited = visited + 1
    end
  until cursor == '0' or visited >= cap
  FANNED = FANNED + visited
  return cursor
end

-- run was written: each run waiting for it to change may now be eligible. Up to
-- MAX_FANOUT waiters are re-indexed here; a dependency with more is queued in FANOUT and
-- finished by the next claim_ready calls (a waiter is never missed, only delayed).
local function notify_dependents(run, pv)
  local ix = deps_ix(run)
  if not of_type(ix.key, 'set') or TYPES[ix.key] == 'none' then return end
  local cursor = fan_out(run, '0', pv)
  if cursor ~= '0' then
    later('ZADD', FANOUT, int(now_ms()), run)
    later('HSET', FANOUT_CURSOR, run, cursor)
    -- The rest are re-indexed by claim_ready calls: wake one, whatever the first page held.
    queue_token(SIGNALS, WAKE_READY, run)
  end
end
