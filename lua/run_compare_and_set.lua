-- run_compare_and_set: write revision expected + 1 under a lease condition, atomically.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."ready"
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4]  record bytes
-- ARGV[5]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release, 'f' Fenced (the lease
--          stays), 'F' Fenced with release
-- ARGV[6]  owner ('' for Release)
-- ARGV[7]  ttl ms ('0' without one); for 'f' and 'F' the grant's token
-- ARGV[8..11] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[12] projection version
-- ARGV[13..16] optional: a dependency of another partition's watch (arg_wait)
-- Reply    {REWATCH, unwatched} (its dependency's watch may be undone: watch again, above
--          unwatched, and send again; nothing written) | {OK} | {NOT_FOUND}
--          | {CONFLICT, current} | {REFUSED, {owner|false, live 0|1}} | {CORRUPT, field}
--          | {TOO_NEW, layout} | {TOO_OLD, layout}; nothing written but on OK
-- Also touches, undeclared (same hash tag): P.."r:"..dep (its dependency's revision),
-- P.."d:"..dep (the waiters of its old and new dependency), P.."d:"..run and the P.."r:" of
-- those waiters (re-indexed), P.."fanout", P.."fanout-cursor", P.."quarantine",
-- P.."wake-ready" and P.."wake-leases" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- Fast path: a write under Release, Hold or Fenced as lean.lua's lean_write takes it (no
-- dependency, no poll wait, nothing waiting on the run); any other case, before anything is
-- written, takes the general code.
--- @include op_cas, cas_args, lean_alone
local reply = lean_alone(true)
if reply then
  return reply
end
--- @slow
return op_cas(cas_args())
