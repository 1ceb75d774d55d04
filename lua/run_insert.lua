-- run_insert: create a run at revision 1, with a lease for Claim / Seize.
-- KEYS[1]  the run's hash       KEYS[2] P.."leases"       KEYS[3] P.."ready"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] record bytes
-- ARGV[4]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[5]  owner ('' for Release)                          ARGV[6] ttl ms ('0' without one)
-- ARGV[7..10] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[11] projection version
-- Reply    {0} ok | {2} already exists (nothing written)
local k = KEYS[1]
-- HSETNX both checks and starts the write: one call instead of EXISTS + HSET.
if redis.call('HSETNX', k, 'rev', '1') == 0 then return {2} end
write(k, ARGV[2], {}, 1, ARGV[3], 4)
return {0}
