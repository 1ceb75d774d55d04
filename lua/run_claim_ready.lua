-- run_claim_ready: claim up to limit free runs whose wait is eligible, earliest first.
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
--          (ARGV[7] has no use here: '')
-- Reply    {OK, {claimed run ids, in claim order}, dropped, wait} | {TOO_NEW, layout}
--          | {TOO_OLD, layout} | {CORRUPT, what}
--          with records: {OK, {{run, current}, ...}, dropped, wait} (current as run_get)
-- First goes on (up to MAX_CLAIM_FANOUT waiters) with the re-indexing of a dependency with
-- many waiters; then visits at most limit + MAX_VISIT index entries. The run decides, not the
-- index (stale metadata, a lower projection version, a back-off): an entry is claimed,
-- re-scored, dropped, or quarantined when its run is missing, of another type or corrupt.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each entry visited and of the
-- dependencies it checks (read; written when claimed), P.."d:"..dep and P.."fanout-cursor"
-- (the pending re-indexing), P.."quarantine" (an entry quarantined), P.."wake-ready" and
-- P.."wake-leases" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- Fast path: every entry it visits due now and taken as it is (lean.lua's lean_claim), a
-- lease of at least WAKE_AHEAD ms, in a namespace of one partition at layout 5; any other
-- case, before anything is written, takes the general code.
--- @include op_claim, claim_args, lean_claim_args, lean_claim, lean_take
local a = lean_claim_args(2)
local plan = a and lean_claim('ready', a)
local reply = plan and lean_take('ready', a, plan)
if reply then
  return reply
end
--- @slow
return op_claim('ready', claim_args())
