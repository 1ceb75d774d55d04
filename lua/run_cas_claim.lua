-- run_cas_claim: compare_and_set and then a claim, one script (a pipeline that queues the
-- two sends them so): the claim sees what the first left, in the same atomic step.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."ready"
-- KEYS[4]  P.."meta"
-- KEYS[5]  P.."fanout"
-- ARGV[1]  key prefix           ARGV[2] n: how many arguments the first takes after the prefix
-- ARGV[3 .. n + 2] run_compare_and_set's ARGV[2..], the first of them:
-- ARGV[3]  run
-- ARGV[n + 3] the claim's kind: 'ready', 'leases' or 'any'
-- ARGV[n + 4 ..] run_claim's ARGV[2..]
-- Reply    {first's reply, claim's reply}: each as its own script answers it; the claim's
--          false when the first answered anything but OK (the claim did not run: the caller
--          sends it alone). Both sets of arguments are checked before anything is written.
-- Also touches, undeclared (same hash tag): what run_compare_and_set and run_claim touch.
-- Fast path: the first call as lean.lua's lean_write takes it (a write with a record that
-- frees a held run), then the claim as lean_claim takes it; any other case, before anything
-- is written, takes the general code.
--- @include two_ops, cas_args, op_cas, lean_two
local reply = ARGV[2] == '11' and lean_two(11, true)
if reply then
  return reply
end
--- @slow
return two_ops(cas_args, op_cas)
