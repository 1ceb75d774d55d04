-- repo_list_in_flight: the group's claimable in-flight ids at now: a range query on the
-- group's index, O(log N + result). Lease expiry == now counts as expired.
-- KEYS[1]  P.."inflight:"..group
-- ARGV[1]  key prefix           ARGV[2] now (µs since the epoch; '' for the server's TIME)
-- Reply    {0, id...}  (no lease first, then by expiry, ties by id)
local now = ARGV[2]
if now == '' then now = int(now_us()) end
-- Scores are doubles: below now's score the expiry is certainly before now; at exactly
-- now's score (equal, or rounded together beyond 2^53 µs) compare the exact texts.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now, now)) do
  local x = redis.call('HGET', inst_key(id), 'x')
  if x and x ~= '' and int_le(x, now) then ids[#ids + 1] = id end
end
table.insert(ids, 1, 0)
return ids
