-- run_partitions: the partition count of a namespace's runs, recorded by the first store
-- that spreads it over more than one (redisstore.core.partitions). Checks, then writes. (The
-- instance repository keeps a count of its own: repo_partitions.)
-- KEYS[1]  P.."meta" (the namespace's own, {ns}: the partitions' keys are {ns#p})
-- KEYS[2]  P.."leases" (read: a namespace in use has one)
-- ARGV[1]  key prefix (the namespace's own: never a partition's)
-- ARGV[2]  the count this store was opened with
-- Reply    {OK, count} | {CORRUPT, 'meta' | 'meta.partitions'}: the namespace's count, as
--          recorded; 1 when none is and a store of one partition used the namespace (its
--          keys are there); else this store's count, now recorded (a store of one partition
--          then refuses the namespace: every run script reads the count from meta); 0 while
--          a repartition is under way.
--- @include CORRUPT, MAX_PARTITIONS, OK, LEASES, P, META, decimal, of_type, arg_int
local n = arg_int(2, 1, MAX_PARTITIONS)
-- A partition's meta never holds a count: one recorded there would say nothing.
if string.find(P, '#', 1, true) then error('BADARG ARGV[1] must be a namespace, not a partition') end
if #KEYS ~= 2 or KEYS[1] ~= META or KEYS[2] ~= LEASES then
  error('BADARG KEYS must be the namespace meta and leases keys')
end
if not of_type(KEYS[1], 'hash') then return {CORRUPT, 'meta', 0, -1} end
-- In use by a store of one partition (its every write records the layout in meta): its
-- runs are under {ns}, where a store of partitions would not look.
local used = redis.call('EXISTS', KEYS[1], KEYS[2]) > 0
-- Each field sized before it is read: a value planted there is never read whole.
if redis.call('HSTRLEN', KEYS[1], 'partitions') > 16
    or redis.call('HSTRLEN', KEYS[1], 'repartition-to') > 16 then
  return {CORRUPT, 'meta.partitions', 0, -1}
end
local got, moving = unpack(redis.call('HMGET', KEYS[1], 'partitions', 'repartition-to'))
-- A repartition under way (redisstore.repartition): no store opens the namespace.
if moving then return {OK, 0, 0, -1} end
if got then
  -- Never 1: one partition records nothing.
  local recorded = decimal(got, 2, MAX_PARTITIONS)
  if recorded == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
  return {OK, recorded, 0, -1}
end
if n == 1 or used then return {OK, 1, 0, -1} end
redis.call('HSET', KEYS[1], 'partitions', n)
return {OK, n, 0, -1}
