-- run_claim_expired: claim up to limit held, expired leases, the longest-expired first.
-- KEYS[1]  P.."leases"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit
-- Reply    {0, {claimed run ids, in claim order}}
local owner, limit = ARGV[2], tonumber(ARGV[4])
local now = now_ms()
local exp = int(now + tonumber(ARGV[3]))
local out = {}
while #out < limit do
  local runs = redis.call('ZRANGEBYSCORE', LEASES, '-inf', int(now), 'LIMIT', 0, limit - #out)
  if #runs == 0 then break end
  for _, run in ipairs(runs) do
    local k = run_key(run)
    local own = redis.call('HGET', k, 'own')
    if own then
      -- Claim info belongs to the owner whose ready claim made it.
      if own ~= owner then redis.call('HDEL', k, 'ck', 'cdr', 'cat') end
      redis.call('HSET', k, 'own', owner, 'exp', exp)
      redis.call('ZADD', LEASES, exp, run)
      out[#out + 1] = run
    else
      -- An index entry without a lease behind it must not be claimed again and again.
      redis.call('ZREM', LEASES, run)
    end
  end
end
return {0, out}
