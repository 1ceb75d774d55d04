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
--- @include CORRUPT, MAX_CLAIM, MAX_CLAIM_BYTES, OK, arg_int, arg_flag, WAKE_READY
--- @include MAX_TTL, now_ms, arg_text, DROPPED, READY_IX, index_intact, commit
--- @include check_layout, due, wait_after_claim, reindex_first, take_ready
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
local limit = arg_int(4, 0, MAX_CLAIM)
local pv = arg_int(5, 0, 2147483648)
local budget = arg_int(6, 0, MAX_CLAIM_BYTES)
local strict = arg_flag(7)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if not index_intact(READY_IX) then return {CORRUPT, 'index:ready', 0, -1} end
local more_pending, bad = reindex_first(pv)
if bad then return bad end
local now = now_ms()
local out = {}
for run, s in due(READY_IX, limit, out) do
  if take_ready(run, s, owner, ttl, now, pv, budget, strict, out) then break end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, out, DROPPED, wait_after_claim(WAKE_READY, READY_IX, #out, more_pending)}
