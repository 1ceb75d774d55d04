-- run_refresh: re-derive a run's wait from its current record (the caller ran discover on
-- the record it read at revision expected); changes no record, revision or lease.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."ready"
-- KEYS[3]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4..7] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[8]  projection version
-- ARGV[9..12] optional: a dependency of another partition's watch (arg_wait)
-- Reply    {REWATCH, unwatched} (its dependency's watch may be undone: watch again, above
--          unwatched, and send again; nothing written) | {OK, indexed 0|1} | {NOT_FOUND} | {CONFLICT, current} (the record moved on)
--          | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}
-- Also touches, undeclared (same hash tag): P.."leases" and P.."fanout" (their types
-- checked), P.."d:"..dep (the waiters of its old and new dependency), P.."r:"..dep,
-- P.."wake-ready" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
--- @include CORRUPT, OK, MAX_INT, arg_int, arg_text, commit, check_layout, save, load_at
--- @include place, arg_wait, apply_wait, rewatch
local run = arg_text(2)
local expected = arg_int(3, 0, MAX_INT)
local w, pv = arg_wait(4)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, refusal = load_at(run, expected)
if not s then return refusal end
local again = rewatch(w)
if again then return again end
apply_wait(run, s, w, pv)
place(run, s, pv, false)
save(run, s)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
if w.wk == '' then return {OK, 0, 0, -1} end
return {OK, 1, 0, -1}
