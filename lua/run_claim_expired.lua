-- run_claim_expired: claim up to limit held, expired leases, the longest-expired first.
-- KEYS[1]  P.."leases"
-- KEYS[2]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit (at most MAX_CLAIM)                       ARGV[5] caller's projection version
-- ARGV[6]  record budget: 0 for ids only, else bytes (at most MAX_CLAIM_BYTES) of records
--          to hand back with the runs; the claim stops before the run that would pass it
-- ARGV[7]  max takeovers: '' for no bound, else an expired lease already taken over that
--          many times is quarantined as poison instead of claimed
-- ARGV[8]  '1': the budget holds for the first run too (a claim over partitions, in all
--          but one of them); absent or '': the first run always comes
--          (ARGV[5] has no use here)
-- Reply    {OK, {claimed run ids, in claim order}, dropped, wait} | {TOO_NEW, layout}
--          | {TOO_OLD, layout} | {CORRUPT, what}
--          with records: {OK, {{run, current}, ...}, dropped, wait} (current as run_get)
-- A claim counts a lost try (attempts) for each run it takes, and from another owner than
-- the expired holder a takeover (tk); a poison run leaves the index, keeps its holder and is
-- listed as "poison|run". Visits at most limit + MAX_VISIT index entries. The run's own
-- expiry decides, not the index score: an entry whose run is missing, of another type or
-- corrupt is quarantined; one whose run is free (or a poison run's) is dropped; one whose
-- lease was extended is re-scored.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each entry visited (read; written
-- when claimed), P.."quarantine" (an entry quarantined), P.."wake-leases" (signals).
-- Fast path: every entry it visits due now and taken as it is (lean.lua's lean_claim), a
-- lease of at least WAKE_AHEAD ms, in a namespace of one partition at layout 5; any other
-- case, before anything is written, takes the general code.
--- @include op_claim, claim_args, lean_claim_args, lean_claim, lean_take
local a = lean_claim_args(2)
local plan = a and lean_claim('leases', a)
local reply = plan and lean_take('leases', a, plan)
if reply then
  return reply
end
--- @slow
return op_claim('leases', claim_args())
