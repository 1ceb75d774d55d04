-- run_claim_ready: claim up to limit free runs whose wait is eligible, earliest first.
-- KEYS[1]  P.."ready"           KEYS[2] P.."leases"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit                ARGV[5] projection version of the caller
-- Reply    {0, {claimed run ids, in claim order}}
local owner, limit, pv = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local exp = int(now + tonumber(ARGV[3]))
local out = {}
while #out < limit do
  local runs = redis.call('ZRANGEBYSCORE', READY, '-inf', int(now), 'LIMIT', 0, limit - #out)
  if #runs == 0 then break end
  for _, run in ipairs(runs) do
    local k = run_key(run)
    local s = load(k)
    -- The index is a hint; the hash decides (stale metadata, a lower projection version).
    local t = eligible_at(s, pv)
    if t ~= nil and t <= now then
      local ck, cdr = '', ''
      if s.wk == 'c' then
        ck = s.wa
        cdr = redis.call('HGET', run_key(s.wa), 'rev') or '0'
      elseif s.wk == 'p' then
        ck = s.wa
        redis.call('HSET', k, 'pt', int(now))
      end
      redis.call('HSET', k, 'own', owner, 'exp', exp, 'ck', ck, 'cdr', cdr, 'cat', int(now))
      redis.call('ZADD', LEASES, exp, run)
      redis.call('ZREM', READY, run)
      out[#out + 1] = run
    elseif t == nil then
      redis.call('ZREM', READY, run)
    else
      redis.call('ZADD', READY, int(t), run)
    end
  end
end
return {0, out}
