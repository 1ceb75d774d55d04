-- run_claim: claim up to limit runs of both kinds, free runs whose wait is eligible and held,
-- expired leases, in due order across both (ties by run id).
-- KEYS[1]  P.."ready"
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."meta"
-- KEYS[4]  P.."fanout"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit (at most MAX_CLAIM)                       ARGV[5] caller's projection version
-- ARGV[6]  record budget: 0 for ids only, else bytes (at most MAX_CLAIM_BYTES) of records
--          to hand back with the runs; the claim stops before the run that would pass it
-- ARGV[7]  max takeovers: '' for no bound, else an expired lease already taken over that
--          many times is quarantined as poison instead of claimed
-- ARGV[8]  '1': the budget holds for the first run too (a claim over partitions, in all
--          but one of them); absent or '': the first run always comes
-- Reply    {OK, {claimed run ids, in claim order}, dropped, wait} | {TOO_NEW, layout}
--          | {TOO_OLD, layout} | {CORRUPT, what}
--          with records: {OK, {{run, current}, ...}, dropped, wait} (current as run_get)
--          wait: the earlier of the two indexes' (see wait_after_claim)
-- The entries of the two indexes are merged by their scores: a ready entry is due when its
-- run's wait became eligible, a lease entry when the lease expired. Each entry is handled
-- as run_claim_ready or run_claim_expired handles it (take_ready, take_expired); the
-- re-indexing of a dependency's waiters goes on first, as in run_claim_ready. Visits at
-- most limit + MAX_VISIT entries of each index.
-- Also touches, undeclared (same hash tag): what run_claim_ready and run_claim_expired touch.
-- Fast path: every entry it visits due now and taken as it is (lean.lua's lean_claim), a
-- lease of at least WAKE_AHEAD ms, in a namespace of one partition at layout 5; any other
-- case, before anything is written, takes the general code.
--- @include op_claim, claim_args, lean_claim_args, lean_claim, lean_take
local a = lean_claim_args(2)
local plan = a and lean_claim('any', a)
local reply = plan and lean_take('any', a, plan)
if reply then
  return reply
end
--- @slow
return op_claim('any', claim_args())
