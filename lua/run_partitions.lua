-- run_partitions: the partition count of a namespace's runs, or of its instance repository,
-- recorded by the first store (or repository) that spreads it over more than one
-- (redisstore.partitions). The two counts are apart: a run store and a repository of one
-- namespace may have different ones. Checks, then writes.
-- KEYS[1]  P.."meta" (the namespace's own, {ns}: the partitions' keys are {ns#p})
-- KEYS[2]  P.."leases" (runs: a layout 3 index) or P.."groups" (the repository), read: a
--          namespace in use by one partition has it, or KEYS[3]
-- KEYS[3]  P.."L/" (runs: a layout 4 directory) or P.."repo-layout" (the repository), read
-- ARGV[1]  key prefix (the namespace's own: never a partition's)
-- ARGV[2]  the count this store was opened with        ARGV[3] 'runs' | 'repo'
-- Reply    {OK, count} | {CORRUPT, 'meta' | 'meta.partitions' | 'meta.repo-partitions'}:
--          the count as recorded (meta field 'partitions' for runs, 'repo-partitions' for
--          the repository); 1 when none is and one partition used the namespace (its keys
--          are there); else this store's count, now recorded (a store or repository of one
--          partition then refuses the namespace: its scripts read the count from meta); 0
--          while a repartition of the runs is under way.
--- @include CORRUPT, MAX_PARTITIONS, OK, P, decimal, arg_int, of_type
local n = arg_int(2, 1, MAX_PARTITIONS)
local kind = ARGV[3]
local field, used_keys
if kind == 'runs' then
  field, used_keys = 'partitions', {P .. 'leases', P .. 'L/'}
elseif kind == 'repo' then
  field, used_keys = 'repo-partitions', {P .. 'groups', P .. 'repo-layout'}
else
  error("BADARG ARGV[3] must be 'runs' or 'repo'")
end
-- A partition's meta never holds a count: a count there would wall the partition.
if string.find(P, '#', 1, true) then error('BADARG ARGV[1] must be a namespace, not a partition') end
if #KEYS ~= 3 or KEYS[1] ~= P .. 'meta' or KEYS[2] ~= used_keys[1] or KEYS[3] ~= used_keys[2] then
  error('BADARG KEYS must be the namespace meta and the two keys of ARGV[3]')
end
if not of_type(KEYS[1], 'hash') then return {CORRUPT, 'meta', 0, -1} end
-- In use by one partition: its runs (every write records the layout in meta) or records (a
-- save needs a registered group; migrate records its layout) are under {ns}, where a store
-- of partitions would not look.
-- (The meta key counts for runs: a store of one partition writes fields there, the
-- repository only its count.)
local used = redis.call('EXISTS', KEYS[2], KEYS[3]) > 0
  or (kind == 'runs'
      and redis.call('HLEN', KEYS[1]) > redis.call('HEXISTS', KEYS[1], 'repo-partitions'))
local got, moving = unpack(redis.call('HMGET', KEYS[1], field, 'repartition-to'))
-- A repartition of the runs under way (redisstore.repartition): no store opens them.
if moving and kind == 'runs' then return {OK, 0, 0, -1} end
if got then
  -- Never 1: one partition records nothing.
  local recorded = decimal(got, 2, MAX_PARTITIONS)
  if recorded == nil then return {CORRUPT, 'meta.' .. field, 0, -1} end
  return {OK, recorded, 0, -1}
end
if n == 1 or used then return {OK, 1, 0, -1} end
redis.call('HSET', KEYS[1], field, n)
return {OK, n, 0, -1}
