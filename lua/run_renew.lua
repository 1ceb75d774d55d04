-- run_renew: extend to now + ttl every listed lease that owner holds live.
-- KEYS[1]  P.."leases"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4..] run ids (distinct)
-- Reply    {0, {renewed run ids, in the given order}}
local owner = ARGV[2]
local now = now_ms()
local exp = int(now + tonumber(ARGV[3]))
local out = {}
for i = 4, #ARGV do
  local run = ARGV[i]
  local k = run_key(run)
  local f = redis.call('HMGET', k, 'own', 'exp')
  -- An expired lease is never renewed: a renewal that arrives after a handoff must not
  -- make the old owner live again.
  if f[1] == owner and tonumber(f[2]) > now then
    redis.call('HSET', k, 'exp', exp)
    redis.call('ZADD', LEASES, exp, run)
    out[#out + 1] = run
  end
end
return {0, out}
