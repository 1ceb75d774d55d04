-- fanout.lua: re-indexing the runs that wait for a run that was written.

-- A waiter w met by a fan-out over ix: placed in READY (from layout 4 its state is saved
-- when its ready score changes), or dropped from ix when missing, quarantined when corrupt.
local function fan_out_one(ix, w, pv)
  local ws, bad = load(w)
  if ws then
    if indexable(ws) then
      local rt = ws.rt
      place(w, ws, pv, true)
      if NS >= 4 and ws.rt ~= rt then save(w, ws) end
    end
  elseif ws == nil then
    ix_rem(ix, w, 0)
  else
    quarantine(ix, w, bad)
  end
end

-- Re-index up to cap (MAX_FANOUT when nil) waiters of dep from cursor; returns the next
-- cursor ('0' when every waiter was visited). Below layout 4 (and while migrating, first) the cursor is the
-- old set's SSCAN cursor; from layout 4 it is "b" and the last waiter visited: buckets are
-- walked in order, each bucket visited counting as a waiter.
local function fan_out(dep, cursor, pv, cap)
  cap = cap or MAX_FANOUT
  local ix = deps_ix(dep)
  local visited = 0
  if string.find(cursor, '^%d+$') and (NS < 4 or OLD_IX) then
    if of_type(ix.old, 'set') then
      repeat
        local page = redis.call('SSCAN', ix.old, cursor, 'COUNT', math.min(100, cap))
        cursor = page[1]
        for _, w in ipairs(page[2]) do
          fan_out_one(ix, w, pv)
          visited = visited + 1
        end
      until cursor == '0' or visited >= cap
    else
      cursor = '0'
    end
    if NS < 4 or cursor ~= '0' then return cursor end
  end
  if NS < 4 then return '0' end
  local after = ''
  if string.sub(cursor, 1, 1) == 'b' then after = string.sub(cursor, 2) end
  if not of_type(ix.dir, 'zset') then return '0' end
  local q = ix_queue(ix)
  local b, walked = '', false
  if after ~= '' then b = bucket_of(q, after) end
  while b and visited < cap do
    visited = visited + 1
    local n = card_of(ix.pre .. b)
    if n and n > 0 then
      local from = '-'
      if after ~= '' then from = '(' .. after end
      local page = redis.call('ZRANGEBYLEX', ix.pre .. b, from, '+', 'LIMIT', 0,
        cap - visited + 1)
      for _, w in ipairs(page) do
        fan_out_one(ix, w, pv)
        visited, after = visited + 1, w
      end
      if visited >= cap then return 'b' .. after end
    else
      -- An empty bucket (a foreign directory entry) or one of another type (dropped): the
      -- cursor moves past its bound, so no later step walks it again.
      if n == false and q.ndropped < 8 then drop_bucket(q, b) end
      if walked then after = b end
    end
    walked = true
    b = next_bound(q, b)
  end
  if b then return 'b' .. after end
  return '0'
end

-- run was written: each run waiting for it to change may now be eligible. Up to
-- MAX_FANOUT waiters are re-indexed here; a dependency with more is queued in FANOUT and
-- finished by the next claim_ready calls (a waiter is never missed, only delayed).
local function notify_dependents(run, pv)
  local ix = deps_ix(run)
  local has = (NS < 4 or OLD_IX) and of_type(ix.old, 'set') and TYPES[ix.old] ~= 'none'
  if NS >= 4 and not has then has = redis.call('EXISTS', ix.pre, ix.dir) > 0 end
  if not has then return end
  local cursor = fan_out(run, '0', pv)
  if cursor ~= '0' then
    later('ZADD', FANOUT, int(now_ms()), run)
    later('HSET', FANOUT_CURSOR, run, cursor)
    -- The rest are re-indexed by claim_ready calls: wake one, whatever the first page held.
    queue_token(SIGNALS, WAKE_READY, run)
  end
end
