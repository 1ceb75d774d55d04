-- repo_save: compare-and-set of one instance record on rec_version, with its indexes.
-- KEYS[1]  the record's hash    KEYS[2] P.."groups"       KEYS[3] P.."inflight:"..group
-- KEYS[4]  P.."terminal"        KEYS[5] P.."terminal-seq"
-- ARGV[1]  key prefix           ARGV[2] id                ARGV[3] expected rec_version
-- ARGV[4]  payload bytes        ARGV[5] group             ARGV[6] tenant
-- ARGV[7]  lease expiry (µs since the epoch, '' none)      ARGV[8] its UTC offset (µs)
-- ARGV[9]  lease owner          ARGV[10] incarnation      ARGV[11] status
-- ARGV[12] class: 'c' claimable once its lease is expired, 's' suspended, 't' terminal
-- ARGV[13] max_terminal
-- Reply    {0, new version, evicted id...} | {3, stored version} | {5} unknown group
--          (nothing written on 3 and 5)
-- Also touches, undeclared (same hash tag): the record's previous group index when the group
-- changes, and the hashes of the terminal records it evicts. The cap is enforced when a
-- record becomes terminal, the only save that adds to the terminal set.
local k, id, group, class = KEYS[1], ARGV[2], ARGV[5], ARGV[12]
local f = redis.call('HMGET', k, 'v', 'g', 'k')
-- Groups are never unregistered: a record already stored in this group proves it is
-- registered, so only a new record or a move to another group asks the registry. (The
-- group is still checked before the version.)
if f[2] ~= group and redis.call('SISMEMBER', KEYS[2], group) == 0 then return {5} end
local stored = tonumber(f[1] or '0')
if stored ~= tonumber(ARGV[3]) then return {3, stored} end
local v = stored + 1
local was = f[3]  -- the class the record had: which indexes hold it now
redis.call('HSET', k, 'v', int(v), 'pl', ARGV[4], 'g', group, 't', ARGV[6], 'x', ARGV[7],
           'xo', ARGV[8], 'o', ARGV[9], 'n', ARGV[10], 's', ARGV[11], 'k', class)
-- Only the indexes the record enters or leaves are touched: a save that keeps an active
-- record active in its group costs three commands.
if was == 'c' and (class ~= 'c' or f[2] ~= group) then
  redis.call('ZREM', inflight_key(f[2]), id)
end
if class == 'c' then
  -- The score is the expiry text itself: the server parses it, Lua never rounds it.
  local score = ARGV[7]
  if score == '' then score = '-inf' end
  redis.call('ZADD', KEYS[3], score, id)
end
local reply = {0, v}
if was == 't' and class ~= 't' then
  redis.call('ZREM', KEYS[4], id)
elseif class == 't' and was ~= 't' then
  -- Ordered by when the record became terminal: a later terminal save keeps its place.
  redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[5]), id)
  local over = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[13])
  if over > 0 then
    -- Terminal records are in no in-flight index: dropping the hash is all there is.
    for _, old in ipairs(redis.call('ZRANGE', KEYS[4], 0, over - 1)) do
      redis.call('DEL', inst_key(old))
      redis.call('ZREM', KEYS[4], old)
      reply[#reply + 1] = old
    end
  end
end
return reply
