-- run_release: free every listed lease that owner holds, live or expired, without a write.
-- KEYS[1]  P.."leases"
-- KEYS[2]  P.."ready"
-- KEYS[3]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] caller's projection version
-- ARGV[4..] run ids (distinct, at most MAX_RENEW)
-- Reply    {OK, {released run ids, in the given order}} | {TOO_NEW, layout}
--          | {TOO_OLD, layout} | {CORRUPT, field} (an index key of another type: nothing
--          written). A corrupt run among them is not released (and does not stop the others).
-- The revision and record stay; claim info goes with the lease; a run with a wait is placed
-- in READY as its wait says (at once when due); a poison run leaves the quarantine.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each listed run, P.."r:"..dep
-- of a Changed wait (read), P.."quarantine" (a poison run released), P.."wake-ready" and
-- P.."wake-leases" (signals).
-- Fast path: runs lean_run reads, with no wait or an At wait due now or WAKE_AHEAD ms
-- ahead or more, in a namespace of one partition at layout 5 (lean_one.lua's
-- lean_release); any other case, before anything is written, takes the general code.
--- @include op_release, release_args, lean_release
local reply = lean_release()
if reply then
  return reply
end
--- @slow
return op_release(release_args())
