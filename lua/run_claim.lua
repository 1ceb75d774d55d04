-- run_claim: claim up to limit runs of both kinds, free runs whose wait is eligible and held,
-- expired leases, in due order across both (ties by run id).
-- KEYS[1]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[2]  P.."leases" (layout 3 index: from layout 4 not read once migrated)
-- KEYS[3]  P.."meta"
-- KEYS[4]  P.."fanout"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit (at most MAX_CLAIM)                       ARGV[5] caller's projection version
-- ARGV[6]  record budget: 0 for ids only, else bytes (at most MAX_CLAIM_BYTES) of records
--          to hand back with the runs; the claim stops before the run that would pass it
-- ARGV[7]  max takeovers: '' for no bound, else an expired lease already taken over that
--          many times is quarantined as poison instead of claimed (layout 3 only)
-- ARGV[8]  '1': the budget holds for the first run too (a claim over partitions, in all
--          but one of them); absent or '': the first run always comes
-- Reply    {OK, {claimed run ids, in claim order}, dropped, wait} | {TOO_NEW, layout}
--          | {TOO_OLD, layout} (a bound below layout 3)
--          with records: {OK, {{run, current}, ...}, dropped, wait} (current as run_get)
--          wait: the earlier of the two indexes' (see wait_after_claim)
-- The entries of the two indexes are merged by their scores: a ready entry is due when its
-- run's wait became eligible, a lease entry when the lease expired. Each entry is handled
-- as run_claim_ready or run_claim_expired handles it (take_ready, take_expired); the
-- re-indexing of a dependency's waiters goes on first, as in run_claim_ready. Visits at
-- most limit + MAX_VISIT entries of each index.
-- Also touches, undeclared (same hash tag): what run_claim_ready and run_claim_expired touch.
--- @include CORRUPT, MAX_CLAIM, MAX_CLAIM_BYTES, OK, arg_int, arg_flag, WAKE_READY
--- @include WAKE_LEASES, MAX_TTL, now_ms, opt_decimal, arg_text, DROPPED, READY_IX
--- @include LEASES_IX, index_intact, commit, check_layout, MAX_TAKEOVERS, due
--- @include wait_after_claim, needs_layout_3, reindex_first, take_ready, take_expired
--- @include bytes_before
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
local limit = arg_int(4, 0, MAX_CLAIM)
local pv = arg_int(5, 0, 2147483648)
local budget = arg_int(6, 0, MAX_CLAIM_BYTES)
local bound = opt_decimal(ARGV[7], 0, MAX_TAKEOVERS)
if bound == nil then error('BADARG ARGV[7] must be empty or an integer in [0, ' ..
  MAX_TAKEOVERS .. ']') end
local strict = arg_flag(8)
local bad_layout = check_layout() or (bound and needs_layout_3())
if bad_layout then return bad_layout end
if not index_intact(READY_IX) then return {CORRUPT, 'index:ready', 0, -1} end
if not index_intact(LEASES_IX) then return {CORRUPT, 'index:leases', 0, -1} end
local more_pending, bad = reindex_first(pv)
if bad then return bad end
local now = now_ms()
local out = {}
-- The head of each index, read one ahead; the earlier goes first. A run is in one index
-- at a time; if a stale entry names it in both, the state both see is the same table
-- (load caches it), so the second meets the run as the first left it.
local next_ready, next_lease = due(READY_IX, limit, out), due(LEASES_IX, limit, out)
local rr, rs, rt, lr, ls, lt
while #out < limit do
  if next_ready and not rr then
    rr, rs, rt = next_ready()
    if not rr then next_ready = nil end
  end
  if next_lease and not lr then
    lr, ls, lt = next_lease()
    if not lr then next_lease = nil end
  end
  local stop
  if rr and (not lr or rt < lt or (rt == lt and bytes_before(rr, lr))) then
    stop = take_ready(rr, rs, owner, ttl, now, pv, budget, strict, out)
    rr = nil
  elseif lr then
    stop = take_expired(lr, ls, owner, ttl, now, bound, budget, strict, out)
    lr = nil
  else
    break
  end
  if stop then break end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
local ready_wait = wait_after_claim(WAKE_READY, READY_IX, #out, more_pending)
local lease_wait = wait_after_claim(WAKE_LEASES, LEASES_IX, #out, false)
local wait = ready_wait
if wait < 0 or (lease_wait >= 0 and lease_wait < wait) then wait = lease_wait end
return {OK, out, DROPPED, wait}
