-- run_delete: remove a run at revision expected under a lease condition, atomically.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[3]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[5]  owner ('' for Release)                          ARGV[6] ttl ms (not used)
-- ARGV[7]  caller's projection version (to re-index the run's waiters)
-- Reply    {OK} | {NOT_FOUND} | {CONFLICT, current} | {REFUSED, {owner|false, live 0|1}}
--          | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}; nothing written but
--          on OK
-- The checks are compare_and_set's. Then the run key and its index entries go, meta's
-- deleted-rev rises to its revision (an insert of the id starts above it: a stale expected
-- never matches again), and the runs waiting for it to change are re-indexed: it reads as
-- revision 0. Needs layout 3 (a library that knows only layout 2 would re-insert the id at
-- revision 1).
-- Also touches, undeclared (same hash tag): P.."d:"..dep (the waiters of its dependency),
-- P.."d:"..run and the P.."r:" of those waiters (re-indexed), P.."fanout",
-- P.."fanout-cursor", P.."quarantine", P.."wake-ready" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
--- @include CORRUPT, OK, int, arg_int, later, QUARANTINE, META, MAX_INT, arg_text
--- @include LEASES_IX, READY_IX, ix_rem, commit, check_layout, run_key, SEEN, GONE
--- @include deleted_rev, announce, load_at, arg_lease, apply_wait, notify_dependents
--- @include lease_refusal, needs_layout_3
local run = arg_text(2)
local expected = arg_int(3, 0, MAX_INT - 2)
local kind, owner = arg_lease(4)
local pv = arg_int(7, 0, 2147483648)
local bad_layout = check_layout() or needs_layout_3()
if bad_layout then return bad_layout end
local s, refusal = load_at(run, expected)
if not s then return refusal end
refusal = lease_refusal(s, kind, owner)
if refusal then return refusal end
local floor = deleted_rev()
if not floor then return {CORRUPT, 'meta.deleted-rev', 0, -1} end
apply_wait(run, s, {wk = ''}, pv)
later('DEL', run_key(run))
ix_rem(LEASES_IX, run, s.lx)
ix_rem(READY_IX, run, s.rx)
if s.px then later('HDEL', QUARANTINE, 'poison|' .. run) end
if s.rev > floor then later('HSET', META, 'deleted-rev', int(s.rev)) end
SEEN[run] = GONE
notify_dependents(run, pv)
announce(run, 2 * s.rev + 1)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, false, 0, -1}
