-- run_watch: a run of another partition is about to wait on run: note that partition as a
-- watcher of run (its writes are then announced there), with a new watch number, and answer
-- run's version and that number. The first half of a dependency across partitions
-- (redisstore.partitions); safe to repeat (each time a new number).
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix (a partition's, {ns#p}:)                 ARGV[2] run (the dependency)
-- ARGV[3]  the watching partition (0 to MAX_PARTITIONS - 1)
-- ARGV[4]  optional: a number the new watch number must be above (the watcher's unwatched,
--          after a REWATCH: a counter lost to a foreign write can never repeat a number)
-- Reply    {OK, {version, watch number}}: version 2 * run's revision, or 2 * deleted-rev + 1
--          when it is absent (read as revision 0) | {CORRUPT, field} | {TOO_NEW, layout}
-- Also touches, undeclared (same hash tag): P.."r:"..run (read), P.."watch:"..run,
-- P.."watch-seq" (the last watch number given).
--- @include CORRUPT, MAX_PARTITIONS, OK, P, int, decimal, arg_int, later, PARTITION
--- @include MAX_INT, arg_text, TYPES, of_type, commit, check_layout, deleted_rev
--- @include version_of, watchers
local run = arg_text(2)
local watcher = arg_int(3, 0, MAX_PARTITIONS - 1)
local floor = 0
if ARGV[4] ~= nil and ARGV[4] ~= '' then floor = arg_int(4, 0, MAX_INT - 1) end
if not PARTITION then error('BADARG ARGV[1] must be the prefix of a partition, {ns#p}:') end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if not deleted_rev() then return {CORRUPT, 'meta.deleted-rev', 0, -1} end
local key = P .. 'watch:' .. run
if not watchers(run) then return {CORRUPT, 'watch:' .. run, 0, -1} end
local counter = P .. 'watch-seq'
if not of_type(counter, 'string') then return {CORRUPT, 'watch-seq', 0, -1} end
local last = 0
if TYPES[counter] ~= 'none' then
  last = redis.call('STRLEN', counter) <= 16 and decimal(redis.call('GET', counter), 0, MAX_INT - 1)
  if not last then return {CORRUPT, 'watch-seq', 0, -1} end
end
local seq = math.max(last, floor) + 1
if redis.call('HSTRLEN', key, int(watcher)) > 0 then
  -- Numbers only rise: one at or below this watcher's last (a counter a foreign write set
  -- back) moves above it.
  local prev = decimal(redis.call('HGET', key, int(watcher)), 0, MAX_INT - 1)
  if prev and prev >= seq then seq = prev + 1 end
end
local v = version_of(run)
later('SET', counter, int(seq))
later('HSET', key, int(watcher), int(seq))
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, {v, seq}, 0, -1}
