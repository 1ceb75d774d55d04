-- run_insert: create a run at revision 1 (one above meta's deleted-rev, the highest revision
-- a deleted run had), with a lease for Claim / Seize.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[3]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] record bytes
-- ARGV[4]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[5]  owner ('' for Release)                          ARGV[6] ttl ms ('0' without one)
-- ARGV[7..10] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[11] projection version
-- Reply    {REWATCH, unwatched} (its dependency's watch may be undone: watch again, above
--          unwatched, and send again; nothing written) | {OK, revision} | {EXISTS} | {CORRUPT, field} | {TOO_NEW, layout}; nothing written
--          but on OK
-- Also touches, undeclared (same hash tag): P.."r:"..dep (its dependency's revision),
-- P.."d:"..dep (the waiters of its dependency), P.."d:"..run and the P.."r:" of those
-- waiters (re-indexed), P.."fanout", P.."fanout-cursor", P.."quarantine", P.."wake-ready"
-- and P.."wake-leases" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
--- @include CORRUPT, EXISTS, OK, MAX_RECORD_CEILING, arg_text, commit, check_layout, load
--- @include arg_wait, arg_lease, write, deleted_rev
--- @include rewatch
local run, record = arg_text(2), ARGV[3]
if #record > MAX_RECORD_CEILING then error('BADARG the record is over ' .. MAX_RECORD_CEILING .. ' bytes') end
local kind, owner, ttl = arg_lease(4)
local w, pv = arg_wait(7)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s = load(run)
-- A key there, even a damaged one, is never overwritten.
if s ~= nil then return {EXISTS, false, 0, -1} end
local floor = deleted_rev()
if not floor then return {CORRUPT, 'meta.deleted-rev', 0, -1} end
local again = rewatch(w)
if again then return again end
write(run, {own = false, exp = false}, floor + 1, record, kind, owner, ttl, w, pv)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, floor + 1, 0, -1}
