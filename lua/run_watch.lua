-- run_watch: a run of another partition is about to wait on run: note that partition as a
-- watcher of run (its writes are then announced there), with a new watch number, and answer
-- run's version and that number. The first half of a dependency across partitions
-- (redisstore.core.partitions); safe to repeat (each time a new number).
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix (a partition's, {ns#p}:)                 ARGV[2] run (the dependency)
-- ARGV[3]  the watching partition (0 to MAX_PARTITIONS - 1), or "*": every partition but
--          this one of a store of ARGV[5] partitions, each with a new number where it has
--          none (a claim delivering "*|"..run: the "*" a damaged watch key left goes)
-- ARGV[4]  optional: a number the new watch number must be above (the watcher's unwatched,
--          after a REWATCH: a counter lost to a foreign write can never repeat a number)
-- Reply    {OK, {version, watch number}}: version 2 * run's revision, or 2 * deleted-rev + 1
--          when it is absent (read as revision 0) | {CORRUPT, field} | {TOO_NEW, layout}
-- Also touches, undeclared (same hash tag): P.."r:"..run (read), P.."watch:"..run,
-- P.."watch-seq" (the last watch number given).
--- @include CORRUPT, MAX_PARTITIONS, OK, P, WATCH_SEQ, arg_text, int, decimal, TYPES
--- @include of_type, WATCH_KEY, arg_int, commit, check_layout, later, PARTITION
--- @include version_of, watchers, rewatch_all, MAX_INT, deleted_floor, set_aside
local run = arg_text(2)
local all = ARGV[3] == '*' and arg_int(5, 2, MAX_PARTITIONS)
local watcher = all and 0 or arg_int(3, 0, MAX_PARTITIONS - 1)
local floor = 0
if ARGV[4] ~= nil and ARGV[4] ~= '' then floor = arg_int(4, 0, MAX_INT - 1) end
if not PARTITION then error('BADARG ARGV[1] must be the prefix of a partition, {ns#p}:') end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local floor, bad = deleted_floor()
if not floor then return {CORRUPT, bad, 0, -1} end
local key = P .. WATCH_KEY .. run
-- A damaged watch key is set aside: every partition watches (rewatch_all).
local ws = watchers(run) or rewatch_all(run)
local counter = WATCH_SEQ
local last = 0
if not of_type(counter, 'string') then
  set_aside('watch-seq', 'type')
elseif TYPES[counter] ~= 'none' then
  last = redis.call('STRLEN', counter) <= 16 and decimal(redis.call('GET', counter), 0, MAX_INT - 1)
  -- A damaged counter starts again: numbers still rise per watcher (below), and a
  -- watcher's REWATCH floor lifts them above what it unwatched.
  if not last then
    set_aside('watch-seq', 'damaged')
    last = 0
  end
end
local function numbered(w)
  local seq = math.max(last, floor) + 1
  local size = TYPES[key] ~= 'none' and redis.call('HSTRLEN', key, int(w)) or 0
  if size > 0 and size <= 16 then  -- a longer value is no number of ours: not read
    -- Numbers only rise: one at or below this watcher's last (a counter a foreign write set
    -- back) moves above it.
    local prev = decimal(redis.call('HGET', key, int(w)) or '', 0, MAX_INT - 1)
    if prev and prev >= seq then seq = prev + 1 end
  end
  last = seq
  later('HSET', key, int(w), int(seq))
  return seq
end
local v = version_of(run)
local seq = 0
if all then
  local own = tonumber(string.match(P, '#(%d+)}:$'))
  local have = {}
  for _, w in ipairs(ws) do have[w] = true end
  for w = 0, all - 1 do
    if w ~= own and not have[int(w)] then numbered(w) end
  end
  if have['*'] then later('HDEL', key, '*') end
else
  seq = numbered(watcher)
end
if last > 0 then later('SET', counter, int(last)) end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, {v, seq}, 0, -1}
