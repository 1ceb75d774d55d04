-- run_watch: a run of another partition is about to wait on run: note that partition as a
-- watcher of run (its writes are then announced there) and answer run's version. The first
-- half of a dependency across partitions (redisstore.partitions); safe to repeat.
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix (a partition's, {ns#p}:)                 ARGV[2] run (the dependency)
-- ARGV[3]  the watching partition (0 to MAX_PARTITIONS - 1)
-- Reply    {OK, version}: 2 * run's revision, or 2 * deleted-rev + 1 when it is absent (read
--          as revision 0) | {CORRUPT, field} | {TOO_NEW, layout}
-- Also touches, undeclared (same hash tag): P.."r:"..run (read), P.."watch:"..run.
--- @include CORRUPT, MAX_PARTITIONS, OK, P, int, arg_int, later, PARTITION, arg_text
--- @include of_type, commit, check_layout, deleted_rev, version_of
local run = arg_text(2)
local watcher = arg_int(3, 0, MAX_PARTITIONS - 1)
if not PARTITION then error('BADARG ARGV[1] must be the prefix of a partition, {ns#p}:') end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if not deleted_rev() then return {CORRUPT, 'meta.deleted-rev', 0, -1} end
local key = P .. 'watch:' .. run
if not of_type(key, 'set') then return {CORRUPT, 'watch:' .. run, 0, -1} end
local v = version_of(run)
later('SADD', key, int(watcher))
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, v, 0, -1}
