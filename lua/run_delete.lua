-- run_delete: remove a run at revision expected under a lease condition, atomically.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."ready"
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release, 'f' or 'F' Fenced,
--          'j' InSession
-- ARGV[5]  owner ('' for Release)
-- ARGV[6]  ttl ms (not used); for 'f' and 'F' the grant's token, for 'j' the session id
-- ARGV[7]  caller's projection version (to re-index the run's waiters)
-- Reply    {OK} | {NOT_FOUND} | {CONFLICT, current} | {REFUSED, {owner|false, live 0|1}}
--          | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}; nothing written but
--          on OK
-- The checks are compare_and_set's. Then the run key and its index entries go, meta's
-- deleted-rev and deleted-tok rise to its revision and last token (an insert of the id
-- starts above them: a stale expected never matches again, no token is given twice), and
-- the runs waiting for it to change are re-indexed: it reads as revision 0.
-- Also touches, undeclared (same hash tag): P.."d:"..dep (the waiters of its dependency),
-- P.."d:"..run and the P.."r:" of those waiters (re-indexed), P.."fanout",
-- P.."fanout-cursor", P.."quarantine", P.."wake-ready" (signals); a session's run, its
-- session's P.."sessions", P.."s:"..id and P.."st:"..id (told), P.."session-leases".
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
--- @include CORRUPT, OK, SEEN, run_key, GONE, QUARANTINE, LEASES_IX, SESSION, READY_IX
--- @include META, apply_wait, feed_note, ix_rem, arg_text, int, notify_dependents
--- @include lease_refusal, commit, arg_int, deleted_floor, later, check_layout, arg_lease
--- @include MAX_INT, announce, load_at
local run = arg_text(2)
local expected = arg_int(3, 0, MAX_INT - 2)
local kind, owner, token = arg_lease(4)
local pv = arg_int(7, 0, 2147483648)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, refusal = load_at(run, expected)
if not s then return refusal end
refusal = lease_refusal(s, kind, owner, token)
if refusal then return refusal end
local floor, tok = deleted_floor()
if not floor then return {CORRUPT, tok, 0, -1} end
apply_wait(run, s, {wk = ''}, pv)
later('DEL', run_key(run))
if s.lx then ix_rem(LEASES_IX, run) end
SESSION.leave(run, s, kind ~= 'f' and kind ~= 'F')
if s.rx then ix_rem(READY_IX, run) end
if s.px then later('HDEL', QUARANTINE, (s.px == 'p' and 'poison|' or 'failed|') .. run) end
if s.rev > floor then later('HSET', META, 'deleted-rev', int(s.rev)) end
if s.tok > tok then later('HSET', META, 'deleted-tok', int(s.tok)) end
SEEN[run] = GONE
feed_note(run, 'd', s.rev, owner)
notify_dependents(run, pv)
announce(run, 2 * s.rev + 1)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, false, 0, -1}
