-- repo_partitions: the partition count of a namespace's instance repository, recorded by
-- the first repository that spreads it over more than one
-- (redisstore.partitioned_repository). Its own key, apart from the run store's count: a
-- damaged run store meta never reaches the repository. Checks, then writes.
-- KEYS[1]  P.."repo-partitions" (the namespace's own, {ns}: the partitions' keys are {ns#p})
-- KEYS[2]  P.."groups" (read: a repository in use has it, or KEYS[3])
-- KEYS[3]  P.."repo-layout" (read)
-- KEYS[4]  P.."repo-repartition" (read: present while repartition_repository runs)
-- ARGV[1]  key prefix (the namespace's own: never a partition's)
-- ARGV[2]  the count this repository was opened with
-- Reply    {OK, count} | {CORRUPT, 'repo-partitions'}: the count, as recorded; 1 when none
--          is and a repository of one partition used the namespace (its keys are there);
--          0 while the records are moved to another count (nothing written); else this
--          count, now recorded (every script of a repository of one partition then
--          refuses the namespace: spread).
--- @include CORRUPT, MAX_PARTITIONS, OK, P, REPO_PARTITIONS, GROUPS, REPO_LAYOUT
--- @include REPO_REPARTITION, arg_int, arg_key, reply, stored_int
local count_key = arg_key(1, REPO_PARTITIONS)
local groups = arg_key(2, GROUPS)
local layout = arg_key(3, REPO_LAYOUT)
local moving = arg_key(4, REPO_REPARTITION)
local n = arg_int(2, 1, MAX_PARTITIONS)
-- A partition never holds a count: one recorded there would say nothing.
if string.find(P, '#', 1, true) then error('BADARG ARGV[1] must be a namespace, not a partition') end
if redis.call('EXISTS', moving) == 1 then return reply(OK, 0) end
-- Never 1: one partition records nothing.
local recorded = stored_int(count_key, 2, MAX_PARTITIONS)
if recorded == false then return reply(CORRUPT, 'repo-partitions') end
if recorded then return reply(OK, recorded) end
if n == 1 or redis.call('EXISTS', groups, layout) > 0 then return reply(OK, 1) end
redis.call('SET', count_key, n)
return reply(OK, n)
