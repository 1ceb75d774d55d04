-- run_insert: create a run at revision 1 (one above meta's deleted-rev, the highest revision
-- a deleted run had), with a lease for Claim / Seize (its token one above meta's
-- deleted-tok, or above the run's own last grant).
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."ready"
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] record bytes
-- ARGV[4]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release, 'j' InSession
-- ARGV[5]  owner ('' for Release)
-- ARGV[6]  ttl ms ('0' without one); for 'j' the session id
-- ARGV[7..10] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[11] projection version
-- ARGV[12..15] optional: a dependency of another partition's watch (arg_wait)
-- Reply    {REWATCH, unwatched} (its dependency's watch may be undone: watch again, above
--          unwatched, and send again; nothing written) | {OK, revision} | {EXISTS}
--          | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}
--          | {SESSION_LAPSED, id} (InSession: not owner's live session); nothing written but
--          on OK
-- Also touches, undeclared (same hash tag): P.."r:"..dep (its dependency's revision),
-- P.."d:"..dep (the waiters of its dependency), P.."d:"..run and the P.."r:" of those
-- waiters (re-indexed), P.."fanout", P.."fanout-cursor", P.."wake-ready" and
-- P.."wake-leases" (signals); for InSession, P.."sessions" and P.."s:"..id (its runs).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- Fast path: a new run under Release() or Claim() of at least WAKE_AHEAD ms, with no wait
-- or an At wait due now or WAKE_AHEAD ms ahead or more, in a namespace of one partition at
-- layout 5 (lean_one.lua's lean_insert); any other case, before anything is written, takes
-- the general code.
--- @include CORRUPT, EXISTS, OK, arg_record, arg_text, commit, check_layout
--- @include arg_wait, arg_lease, write, deleted_floor, rewatch, run_key, fresh, READ
--- @include lean_insert, lease_refusal
local reply = lean_insert()
if reply then
  return reply
end
--- @slow
local run, record = arg_text(2), arg_record(3)
local kind, owner, ttl = arg_lease(4)
if kind == 'f' or kind == 'F' then error('BADARG ARGV[4]: an insert takes no Fenced lease') end
local w, pv = arg_wait(7)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
-- A key there, even a damaged one, is never overwritten.
local k = run_key(run)
if redis.call('EXISTS', k) == 1 then return {EXISTS, false, 0, -1} end
READ[k] = true
local floor, tok = deleted_floor()
if not floor then return {CORRUPT, tok, 0, -1} end
if kind == 'j' then  -- InSession: owner's live session, which the run joins
  local lapsed = lease_refusal({own = false}, kind, owner, ttl)
  if lapsed then return lapsed end
end
local again = rewatch(w)
if again then return again end
write(run, fresh(tok), floor + 1, record, kind, owner, ttl, w, pv)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, floor + 1, 0, -1}
