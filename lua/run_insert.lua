-- run_insert: create a run at revision 1, with a lease for Claim / Seize.
-- KEYS[1]  the run's hash       KEYS[2] P.."leases"       KEYS[3] P.."ready"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] record bytes
-- ARGV[4]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[5]  owner ('' for Release)                          ARGV[6] ttl ms ('0' without one)
-- ARGV[7..10] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[11] projection version
-- Reply    {0} ok | {2} already exists (nothing written)
local k, run, kind = KEYS[1], ARGV[2], ARGV[4]
if redis.call('EXISTS', k) == 1 then return {2} end
local now = now_ms()
redis.call('HSET', k, 'rec', ARGV[3], 'rev', '1')
if kind == 'c' or kind == 's' then
  take(k, run, ARGV[5], now + tonumber(ARGV[6]))
end
after_write(k, run, 1, now, ARGV[7], ARGV[8], ARGV[9], ARGV[10], tonumber(ARGV[11]))
return {0}
