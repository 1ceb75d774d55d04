-- run_migrate: one bounded step of moving the namespace to layout 3 (one string per run;
-- deletes and poison runs).
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] SCAN COUNT of this step (at most MAX_MIGRATE)
-- Reply    {OK, {moved, done 0|1, damaged}} | {TOO_NEW, layout} | {CORRUPT, field}
-- The first step records layout 3 and a SCAN cursor in meta. From then on every write
-- stores a run as a string and a library that knows only layout 1 or 2 refuses the
-- namespace (TOO_NEW) instead of misreading it; runs still in layout 1 keep being read and are
-- rewritten by their next write or by a step here. A step converts the layout 1 runs of
-- one SCAN page, records of at most MAX_MIGRATE_BYTES in all (at least one run), and keeps
-- the cursor on the page until all of it is converted. A damaged run is left as it is and
-- listed in the quarantine as "migrate|run". A pass ends when SCAN's cursor comes back to
-- 0; a pass that moved runs is followed by another, and the first that moves none removes
-- the cursor: layout 2 or 3 without a cursor means no layout 1 run is left, so a layout 2
-- namespace without one only needs layout 3 recorded, in one step.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each run its SCAN page finds,
-- P.."quarantine" (a damaged run).
--- @include CORRUPT, OK, P, int, decimal, arg_int, later, QUARANTINE, META, NS, LAYOUT
--- @include MAX_MIGRATE, MAX_MIGRATE_BYTES, MAX_INT, commit, check_layout, of_type, load
--- @include save
local count = arg_int(2, 1, MAX_MIGRATE)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local first = NS < LAYOUT
local cursor, pass_moved = '0', 0
if NS > 1 then
  local got = redis.call('HMGET', META, 'migrate-cursor', 'migrate-moved')
  cursor = got[1]
  if not cursor then
    if first then
      later('HSET', META, 'layout', int(LAYOUT))
      local bad_write = commit()
      if bad_write then return {CORRUPT, bad_write, 0, -1} end
    end
    return {OK, {0, 1, 0}, 0, -1}
  end
  if not string.find(cursor, '^%d+$') or #cursor > 20 then
    return {CORRUPT, 'meta.migrate-cursor', 0, -1}
  end
  pass_moved = decimal(got[2] or '0', 0, MAX_INT)
  if not pass_moved then return {CORRUPT, 'meta.migrate-moved', 0, -1} end
end
if not of_type(QUARANTINE, 'hash') then return {CORRUPT, 'quarantine', 0, -1} end
NS = LAYOUT
-- SCAN's MATCH is a glob: the namespace's own *?[]\ are escaped.
local pattern = string.gsub(P, '([%*%?%[%]\\])', '\\%1') .. 'r:*'
local page = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', count)
local moved, damaged, bytes, whole = 0, 0, 0, true
for _, k in ipairs(page[2]) do
  local t = redis.call('TYPE', k)
  if (t.ok or t) == 'hash' then
    local size = redis.call('HSTRLEN', k, 'rec')
    if moved > 0 and bytes + size > MAX_MIGRATE_BYTES then
      whole = false
      break
    end
    local run = string.sub(k, #P + 3)
    local s, bad = load(run)
    if s then
      bytes = bytes + size
      save(run, s)
      moved = moved + 1
    else
      -- Counted once, though a page cut by the byte budget is visited again.
      if redis.call('HEXISTS', QUARANTINE, 'migrate|' .. run) == 0 then
        damaged = damaged + 1
      end
      later('HSET', QUARANTINE, 'migrate|' .. run, bad or 'missing')
    end
  end
end
if first then later('HSET', META, 'layout', int(LAYOUT)) end
local done = 0
if whole then cursor = page[1] end
pass_moved = pass_moved + moved
if whole and cursor == '0' and pass_moved == 0 then
  later('HDEL', META, 'migrate-cursor', 'migrate-moved')
  done = 1
elseif whole and cursor == '0' then
  -- A pass that moved runs is followed by another: a cursor kept across a restart or a
  -- failover means nothing to the new server process (SCAN may have skipped keys), so
  -- only a whole pass that finds nothing to move ends the migration.
  later('HSET', META, 'migrate-cursor', '0', 'migrate-moved', '0')
else
  later('HSET', META, 'migrate-cursor', cursor, 'migrate-moved', int(pass_moved))
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, {moved, done, damaged}, 0, -1}
