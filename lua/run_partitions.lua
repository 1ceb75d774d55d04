-- run_partitions: the partition count of a namespace, recorded by the first store that
-- spreads it over more than one (redisstore.partitions). Checks, then writes.
-- KEYS[1]  P.."meta" (the namespace's own, {ns}: the partitions' keys are {ns#p})
-- KEYS[2]  P.."leases" (a layout 3 index, read: a namespace in use has one)
-- KEYS[3]  P.."L/" (a layout 4 directory, read: as KEYS[2])
-- KEYS[4]  P.."groups", KEYS[5] P.."repo-layout" (the instance repository's, read: a
--          namespace whose repository is in use has them)
-- ARGV[1]  key prefix           ARGV[2] the count this store was opened with
-- Reply    {OK, count} | {CORRUPT, 'meta.partitions'}: the namespace's count, as recorded;
--          1 when none is and a store or repository of one partition used the namespace
--          (its keys are there); else this store's count, now recorded (a store of one partition then
--          refuses the namespace: every run script reads the count from meta); 0 while a
--          repartition is under way.
--- @include CORRUPT, MAX_PARTITIONS, OK, P, decimal, arg_int, of_type
local n = arg_int(2, 1, MAX_PARTITIONS)
if #KEYS ~= 5 or KEYS[1] ~= P .. 'meta' or KEYS[2] ~= P .. 'leases' or KEYS[3] ~= P .. 'L/'
    or KEYS[4] ~= P .. 'groups' or KEYS[5] ~= P .. 'repo-layout' then
  error('BADARG KEYS must be the namespace meta, leases, L/, groups and repo-layout keys')
end
if not of_type(KEYS[1], 'hash') then return {CORRUPT, 'meta', 0, -1} end
-- In use by a store of one partition (its every write records the layout in meta), or by
-- a repository of one (a save needs a registered group; migrate records its layout): its
-- runs or records are under {ns}, where a store of partitions would not look.
local used = redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]) > 0
local got, moving = unpack(redis.call('HMGET', KEYS[1], 'partitions', 'repartition-to'))
-- A repartition under way (redisstore.repartition): no store opens the namespace.
if moving then return {OK, 0, 0, -1} end
if got then
  local recorded = decimal(got, 1, MAX_PARTITIONS)
  if recorded == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
  return {OK, recorded, 0, -1}
end
if n == 1 or used then return {OK, 1, 0, -1} end
redis.call('HSET', KEYS[1], 'partitions', n)
return {OK, n, 0, -1}
