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
local k, run, kind, owner = KEYS[1], ARGV[2], ARGV[5], ARGV[6]
local f = redis.call('HMGET', k, 'rev', 'own', 'exp')
if not f[1] then return {1} end
local rev = tonumber(f[1])
if rev ~= tonumber(ARGV[3]) then return {3, rev} end
local now = now_ms()
local own, live = holder(f[2], f[3], now)
local ok = true
if kind == 'h' then
  ok = own == owner
elseif kind == 'c' then
  ok = (not own) or own == owner or live == 0
end
if not ok then return {4, own, live} end
rev = rev + 1
redis.call('HSET', k, 'rec', ARGV[4], 'rev', int(rev))
if kind == 'c' or kind == 's' then
  take(k, run, owner, now + tonumber(ARGV[7]))
elseif kind == 'r' then
  redis.call('HDEL', k, 'own', 'exp', 'ck', 'cdr', 'cat')
  redis.call('ZREM', LEASES, run)
end
after_write(k, run, rev, now, ARGV[8], ARGV[9], ARGV[10], ARGV[11], tonumber(ARGV[12]))
return {0}
