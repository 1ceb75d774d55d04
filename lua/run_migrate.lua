-- run_migrate: one bounded step of moving the namespace to layout 2 (one string per run).
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] SCAN COUNT of this step (at most MAX_MIGRATE)
-- Reply    {OK, {moved, done 0|1, damaged}} | {TOO_NEW, layout} | {CORRUPT, field}
-- The first step records layout 2 and a SCAN cursor in meta. From then on every write
-- stores a run as a string and a library that knows only layout 1 refuses the namespace
-- (TOO_NEW) instead of misreading it; runs still in layout 1 keep being read and are
-- rewritten by their next write or by a step here. A step converts the layout 1 runs of
-- one SCAN page, records of at most MAX_MIGRATE_BYTES in all (at least one run), and keeps
-- the cursor on the page until all of it is converted. A damaged run is left as it is and
-- listed in the quarantine as "migrate|run". The pass ends when SCAN's cursor comes back
-- to 0: the cursor is removed, and layout 2 without a cursor means done.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each run its SCAN page finds,
-- P.."quarantine" (a damaged run).
--- @include CORRUPT, OK, P, QUARANTINE, META, NS, MAX_MIGRATE, MAX_MIGRATE_BYTES, arg_int
--- @include later, commit, check_layout, of_type, load, save
local count = arg_int(2, 1, MAX_MIGRATE)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local first = NS == 1
local cursor = '0'
if not first then
  cursor = redis.call('HGET', META, 'migrate-cursor')
  if not cursor then return {OK, {0, 1, 0}, 0, -1} end
  if not string.find(cursor, '^%d+$') or #cursor > 20 then
    return {CORRUPT, 'meta.migrate-cursor', 0, -1}
  end
end
if not of_type(QUARANTINE, 'hash') then return {CORRUPT, 'quarantine', 0, -1} end
NS = 2
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
      later('HSET', QUARANTINE, 'migrate|' .. run, bad or 'missing')
      damaged = damaged + 1
    end
  end
end
if first then later('HSET', META, 'layout', '2') end
local done = 0
if whole then cursor = page[1] end
if whole and cursor == '0' then
  later('HDEL', META, 'migrate-cursor')
  done = 1
else
  later('HSET', META, 'migrate-cursor', cursor)
end
commit()
return {OK, {moved, done, damaged}, 0, -1}
