-- repo_list_in_flight: one page of the group's claimable in-flight ids at now: a range of
-- the group's index by rank, O(log N + limit). Lease expiry == now counts as expired.
-- KEYS[1]  P.."inflight:"..group
-- ARGV[1]  key prefix           ARGV[2] group
-- ARGV[3]  now (µs since the epoch; '' for the server's TIME)
-- ARGV[4]  limit: index entries to visit, at most MAX_PAGE
-- ARGV[5], ARGV[6]  the cursor: score text and id of the last entry visited ('' '' first)
-- Reply    {OK, {{id...}, cursor score|false, cursor id|false, now}} | {CORRUPT,
--          'index:inflight'}. No lease first, then by expiry, ties by id. A false cursor:
--          the listing is complete.
-- Also reads, undeclared (same hash tag): P.."repo-partitions" (spread: the repository's
-- count), the hash of each entry visited. Each entry is listed only when its own record
-- says so (of this group, class 'c', expiry '' or <= now): an entry pointing at nothing, at
-- another type or at a record that moved is skipped.
--- @include CORRUPT, OK, arg_int, MAX_PAGE, MAX_US, MIN_US, now_us, inst_key, inflight_key
--- @include int_le, wrong_type, signed, expiry_ok, class_of, arg_text, arg_any, arg_key
--- @include key_type, reply, spread, score, score_text, rank_after
local group = arg_text(2)
local key = arg_key(1, inflight_key(group))
local now = arg_any(3)
if now == '' then
  now = now_us()
elseif not signed(now, MIN_US, MAX_US) then
  error('BADARG ARGV[3] must be empty or microseconds in [' .. MIN_US .. ', ' .. MAX_US .. ']')
end
local limit = arg_int(4, 1, MAX_PAGE)
local after, after_id = arg_any(5), arg_any(6)
if after_id ~= '' then
  local n = score(after)
  if n == nil or n ~= n or score_text(n) ~= after then
    error('BADARG ARGV[5] must be a cursor score as a listing returned it')
  end
end
local refused = spread()
if refused then return refused end
local t = key_type(key)
if t == 'none' then return reply(OK, {{}, false, false, now}) end
if t ~= 'zset' then return reply(CORRUPT, 'index:inflight') end

local start = 0
if after_id ~= '' then start = rank_after(key, after, after_id) end
local page = redis.call('ZRANGE', key, start, start + limit - 1, 'WITHSCORES')
-- Scores are doubles: above now's score the expiry is certainly after now; at or below it
-- the record's own expiry text decides, exactly.
local top = score(now)
local ids = {}
for i = 1, #page, 2 do
  local id = page[i]
  if score(page[i + 1]) > top then return reply(OK, {ids, false, false, now}) end
  local f = redis.pcall('HMGET', inst_key(id), 'g', 'k', 's', 'x')
  if f.err then wrong_type(f) end  -- a key of another type is skipped; any other error aborts
  if not f.err and f[1] == group and f[2] == 'c' and f[3] and class_of(f[3]) == 'c'
      and f[4] and expiry_ok(f[4]) and (f[4] == '' or int_le(f[4], now)) then
    ids[#ids + 1] = id
  end
end
if #page < 2 * limit then return reply(OK, {ids, false, false, now}) end
return reply(OK, {ids, score_text(score(page[#page])), page[#page - 1], now})
