-- run_finish: end a grant of a run at revision expected: write a record and free it, free it,
-- or count a failed try (then hold it back, or quarantine it).
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."ready"
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4]  owner                ARGV[5] the grant's token
-- ARGV[6]  'w': write ARGV[7] as revision expected + 1, then free (attempts, takeovers and
--          not_before start again); 'r': free, nothing written; 'x': a failure (ARGV[8..11])
-- ARGV[7]  record bytes ('' unless 'w')
-- ARGV[8]  the failure's error text (at most MAX_ERROR bytes), or '-' for none
-- ARGV[9]  its delay ms (not before now + delay)            ARGV[10] max attempts ('' none)
-- ARGV[11] '1': final (quarantine now), or ''
-- ARGV[12..15] wait (of the record, with 'w'): kind ('' none, 'c', 'p', 'a'), dependency/key,
--          seen/interval/due, deadline
-- ARGV[16] projection version
-- ARGV[17..20] optional: a dependency of another partition's watch (arg_wait)
-- Reply    as run_compare_and_set's: {OK} | {NOT_FOUND} | {CONFLICT, current}
--          | {REFUSED, {owner|false, live 0|1}} (not the grant of owner and token)
--          | {REWATCH, unwatched} | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}
-- Also touches, undeclared (same hash tag): what run_compare_and_set touches.
-- Fast path: a finish that writes a record and frees the run, as lean.lua's lean_write
-- takes it (no dependency, no poll wait, nothing waiting on the run; a run of a session or
-- of its own lease); any other case, before anything is written, takes the general code.
--- @include op_finish, finish_args, lean_alone
local reply = lean_alone(false)
if reply then
  return reply
end
--- @slow
return op_finish(finish_args())
