-- run_compare_and_set: write revision expected + 1 under a lease condition, atomically.
-- KEYS[1]  the run's hash       KEYS[2] P.."leases"       KEYS[3] P.."ready"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4]  record bytes
-- ARGV[5]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[6]  owner ('' for Release)                          ARGV[7] ttl ms ('0' without one)
-- ARGV[8..11] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[12] projection version
-- Reply    {0} ok | {1} not found | {3, current} conflict
--          {4, owner|false, live 0|1} lease refused (nothing written)
local k, kind, owner = KEYS[1], ARGV[5], ARGV[6]
local s = load(k)
if not s.rev then return {1} end
local rev = tonumber(s.rev)
if rev ~= tonumber(ARGV[3]) then return {3, rev} end
-- Only a Claim over another owner's lease needs the clock to decide.
local own = s.own
if (kind == 'h' and own ~= owner)
    or (kind == 'c' and own and own ~= owner and select(2, holder(own, s.exp)) == 1) then
  return {4, holder(own, s.exp)}
end
write(k, ARGV[2], s, rev + 1, ARGV[4], 5)
return {0}
