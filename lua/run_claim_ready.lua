-- run_claim_ready: claim up to limit free runs whose wait is eligible, earliest first.
-- KEYS[1]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[2]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[3]  P.."meta"
-- KEYS[4]  P.."fanout"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit (at most MAX_CLAIM)                       ARGV[5] caller's projection version
-- ARGV[6]  record budget: 0 for ids only, else bytes (at most MAX_CLAIM_BYTES) of records
--          to hand back with the runs; the claim stops before the run that would pass it
-- ARGV[7]  '1': the budget holds for the first run too (a claim over partitions, in all
--          but one of them); absent or '': the first run always comes
-- Reply    {OK, {claimed run ids, in claim order}, dropped, wait} | {TOO_NEW, layout}
--          with records: {OK, {{run, current}, ...}, dropped, wait} (current as run_get)
-- First goes on (up to MAX_CLAIM_FANOUT waiters) with the re-indexing of a dependency with
-- many waiters; then visits at most limit + MAX_VISIT index entries. The run decides, not the
-- index (stale metadata, a lower projection version): an entry is claimed, re-scored,
-- dropped, or quarantined when its run is missing, of another type or corrupt.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each entry visited and of the
-- dependencies it checks (read; written when claimed), P.."d:"..dep and P.."fanout-cursor"
-- (the pending re-indexing), P.."quarantine" (an entry quarantined), P.."wake-ready" and
-- P.."wake-leases" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
--- @include CORRUPT, MAX_CLAIM, MAX_CLAIM_BYTES, OK, arg_int, arg_flag, later, QUARANTINE
--- @include FANOUT, FANOUT_CURSOR, WAKE_READY, NS, MAX_TTL, now_ms, arg_text, of_type
--- @include DROPPED, READY_IX, deps_ix, ix_rem, ix_add, index_intact, unsignal, commit
--- @include check_layout, save, dep_revision, due, current, claimed_record, eligible_at
--- @include wait_after_claim, hold, fan_out, MAX_CLAIM_FANOUT
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
local limit = arg_int(4, 0, MAX_CLAIM)
local pv = arg_int(5, 0, 2147483648)
local budget = arg_int(6, 0, MAX_CLAIM_BYTES)
local strict = arg_flag(7)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if not index_intact(READY_IX) then return {CORRUPT, 'index:ready', 0, -1} end
if not of_type(FANOUT, 'zset') then return {CORRUPT, 'index:fanout', 0, -1} end
local now = now_ms()
-- The dependency whose waiters are re-indexed first, and whether another is queued.
local queued = redis.call('ZRANGE', FANOUT, 0, 1)
local pending, more_pending = queued[1], queued[2] ~= nil
if pending and not index_intact(deps_ix(pending)) then
  -- Its waiters' set was replaced by another type: nothing to re-index, never a wall.
  later('ZREM', FANOUT, pending)
  later('HDEL', FANOUT_CURSOR, pending)
  later('HSET', QUARANTINE, 'fanout|' .. pending, 'type')
  DROPPED = DROPPED + 1
elseif pending then
  if not of_type(FANOUT_CURSOR, 'hash') then return {CORRUPT, 'index:fanout-cursor', 0, -1} end
  local cursor = redis.call('HGET', FANOUT_CURSOR, pending) or '0'
  if not (string.find(cursor, '^%d+$') and #cursor <= 20) and string.sub(cursor, 1, 1) ~= 'b' then
    cursor = '0'
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
local out = {}
for run, s in due(READY_IX, limit, out) do
  local t = eligible_at(s, pv)
  if t == nil then
    ix_rem(READY_IX, run, s.rx)
    -- From layout 4 the run's state says where its entry is: kept true.
    if s.rt then
      s.rt = false
      save(run, s)
    end
  elseif t > now then
    ix_add(READY_IX, run, t, s.rx)
    if NS >= 4 and s.rt ~= t then
      s.rt = t
      save(run, s)
    end
  else
    local rec = budget > 0 and claimed_record(run, s, budget, #out + strict, READY_IX)
    if rec == nil then break end  -- the records would pass the budget: stop before it
    if budget == 0 or rec then
      hold(run, s, owner, now + ttl)
      s.ck, s.cdr, s.cat = '', false, now
      if s.wk == 'c' then
        s.ck, s.cdr = s.wa, dep_revision(s.wa)
      elseif s.wk == 'p' then
        s.ck, s.pt = s.wa, now
      end
      ix_rem(READY_IX, run, s.rx)
      s.rt = false
      save(run, s)
      unsignal(WAKE_READY, run)
      if budget > 0 then out[#out + 1] = {run, current(s, rec)} else out[#out + 1] = run end
    end
  end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, out, DROPPED, wait_after_claim(WAKE_READY, READY_IX, #out, more_pending)}
