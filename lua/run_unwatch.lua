-- run_unwatch: partition w has no run waiting on run any more: remove w's watch of run, if
-- it is still the one w unwatched (watch number seq; a newer watch, by a waiter between its
-- watch and its write, stays), and w's outbox entry of run with it. The last field gone, the
-- watch key goes. Safe to repeat.
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix (a partition's, {ns#p}:)                 ARGV[2] run (the dependency)
-- ARGV[3]  the unwatching partition w                           ARGV[4] the watch number
-- Reply    {OK, 1 when the watch was removed else 0} | {TOO_NEW, layout}
-- Also touches, undeclared (same hash tag): P.."watch:"..run, P.."outbox".
-- Its writes only remove (HDEL, ZREM: never refused for memory), of keys it read first.
--- @include MAX_PARTITIONS, OK, P, OUTBOX, arg_text, int, decimal, of_type, WATCH_KEY
--- @include arg_int, check_layout, PARTITION, MAX_INT
local run = arg_text(2)
local w = arg_int(3, 0, MAX_PARTITIONS - 1)
local seq = arg_int(4, 1, MAX_INT)
if not PARTITION then error('BADARG ARGV[1] must be the prefix of a partition, {ns#p}:') end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local key = P .. WATCH_KEY .. run
if not of_type(key, 'hash') or redis.call('HSTRLEN', key, int(w)) > 16 then
  return {OK, 0, 0, -1}
end
if decimal(redis.call('HGET', key, int(w)) or '', 0, MAX_INT) ~= seq then return {OK, 0, 0, -1} end
local outbox = of_type(OUTBOX, 'zset')
redis.call('HDEL', key, int(w))
if outbox then redis.call('ZREM', OUTBOX, int(w) .. '|' .. run) end
return {OK, 1, 0, -1}
