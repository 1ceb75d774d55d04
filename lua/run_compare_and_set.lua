-- run_compare_and_set: write revision expected + 1 under a lease condition, atomically.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[3]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4]  record bytes
-- ARGV[5]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[6]  owner ('' for Release)                          ARGV[7] ttl ms ('0' without one)
-- ARGV[8..11] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[12] projection version
-- Reply    {REWATCH, unwatched} (its dependency's watch may be undone: watch again, above
--          unwatched, and send again; nothing written) | {OK} | {NOT_FOUND} | {CONFLICT, current} | {REFUSED, {owner|false, live 0|1}}
--          | {CORRUPT, field} | {TOO_NEW, layout}; nothing written but on OK
-- Also touches, undeclared (same hash tag): P.."r:"..dep (its dependency's revision),
-- P.."d:"..dep (the waiters of its old and new dependency), P.."d:"..run and the P.."r:" of
-- those waiters (re-indexed), P.."fanout", P.."fanout-cursor", P.."quarantine",
-- P.."wake-ready" and P.."wake-leases" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
-- Fast path: a Hold write by the holder in a namespace of one partition at layout 4 (as
-- its meta records), whose wait keeps its dependency and whose run nothing waits on, is a
-- read of the run and one write (write's effects, worked out here); every other call
-- takes the slow path.
--- @include CORRUPT, OK, MAX_RECORD_CEILING, MAX_INT, arg_int, arg_text, commit
--- @include check_layout, load_at, lease_refusal, arg_wait, arg_lease, write
--- @include rewatch, PARTITION, NS, OLD_IX, RECORDED, same_dependency, waited_on
--- @include wait_fields
--- @include save, flush
local run = arg_text(2)
local expected = arg_int(3, 0, MAX_INT - 2)
local record = ARGV[4]
if #record > MAX_RECORD_CEILING then error('BADARG the record is over ' .. MAX_RECORD_CEILING .. ' bytes') end
local kind, owner = arg_lease(5)
local w, pv = arg_wait(8)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if kind ~= 'h' or PARTITION or NS < 4 or OLD_IX or not RECORDED then return SLOW() end
local s, refusal = load_at(run, expected)
if not s then return refusal end
if s.rev >= MAX_INT - 1 then return {CORRUPT, 'rev', 0, -1} end
refusal = lease_refusal(s, kind, owner)
if refusal then return refusal end
-- Held by owner: not in the ready index (rt), so write's place() changes nothing; not
-- poison (put_back); the same dependency (apply_wait changes no index); no waiters to
-- notify. Anything else is the slow path's.
if s.v ~= 2 or s.rt or s.px or not same_dependency(s, w) or waited_on(run) then
  return SLOW()
end
s.rev, s.tk = s.rev + 1, 0
wait_fields(s, w, pv)
save(run, s, record)
flush()
return {OK, false, 0, -1}
--- @slow
local run = arg_text(2)
local expected = arg_int(3, 0, MAX_INT - 2)
local record = ARGV[4]
if #record > MAX_RECORD_CEILING then error('BADARG the record is over ' .. MAX_RECORD_CEILING .. ' bytes') end
local kind, owner, ttl = arg_lease(5)
local w, pv = arg_wait(8)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, refusal = load_at(run, expected)
if not s then return refusal end
if s.rev >= MAX_INT - 1 then return {CORRUPT, 'rev', 0, -1} end
refusal = lease_refusal(s, kind, owner)
if refusal then return refusal end
local again = rewatch(w)
if again then return again end
write(run, s, s.rev + 1, record, kind, owner, ttl, w, pv)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, false, 0, -1}
