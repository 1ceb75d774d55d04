-- run_claim_expired: claim up to limit held, expired leases, the longest-expired first.
-- KEYS[1]  P.."leases"          KEYS[2] P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit (at most MAX_CLAIM)
-- Reply    {OK, {claimed run ids, in claim order}, dropped, next_due} | {TOO_NEW, layout}
-- Visits at most limit + MAX_VISIT index entries. The run's own expiry decides, not the
-- index score: an entry whose run is missing, of another type or corrupt is quarantined;
-- one whose run is free is dropped; one whose lease was extended is re-scored.
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
local limit = arg_int(4, 0, MAX_CLAIM)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if not of_type(LEASES, 'zset') then return {CORRUPT, 'index:leases', 0, -1} end
local now = now_ms()
local exp = int(now + ttl)
local out = {}
for run, s in due(LEASES, 'leases', limit, out) do
  if not s.own then
    later('ZREM', LEASES, run)
  elseif s.exp > now then
    later('ZADD', LEASES, int(s.exp), run)
  else
    -- Claim info belongs to the owner whose ready claim made it.
    if s.own ~= owner then later('HDEL', run_key(run), 'ck', 'cdr', 'cat') end
    later('HSET', run_key(run), 'own', owner, 'exp', exp)
    later('ZADD', LEASES, exp, run)
    out[#out + 1] = run
  end
end
commit()
return {OK, out, DROPPED, next_due(LEASES)}
