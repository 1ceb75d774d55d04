-- run_migrate: one bounded step of moving the namespace to layout 4 (one string per run;
-- deletes and poison runs; bucketed indexes).
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] SCAN COUNT of this step (at most MAX_MIGRATE)
-- Reply    {OK, {runs moved, done 0|1, damaged, index entries moved}} | {TOO_NEW, layout}
--          | {CORRUPT, field}
-- The first step records layout 4, old-ix (the layout 3 index keys may hold entries) and a
-- SCAN cursor in meta. From then on every write stores a run as a string and indexes it in
-- buckets, and a library that knows only layouts 1 to 3 refuses the namespace (TOO_NEW)
-- instead of misreading it; runs still in layout 1 keep being read and are rewritten by
-- their next write or by a step here, and entries still in the old index keys keep being
-- claimed (merged in order) until a step moves them. A step does one of: move up to count
-- entries of the old P.."leases", or up to count / 4 of the old P.."ready" (each run's
-- header gets its ready time), or visit one SCAN page of the namespace's keys: convert its
-- layout 1 runs (records of at most MAX_MIGRATE_BYTES in all, at least one run) and move
-- up to count waiters of each old P.."d:"..dep set, keeping the cursor on the page until
-- all of it is done. A damaged run is left as it is and listed in the quarantine as
-- "migrate|run". A pass ends when SCAN's cursor comes back to 0; a pass that moved
-- anything is followed by another, and the first that moves nothing ends the migration:
-- it removes the cursor and old-ix.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each run its SCAN page finds,
-- P.."d:"..dep of each such set it finds, P.."leases" and P.."ready", the buckets and
-- directories of every index, P.."quarantine" (a damaged run).
--- @include CORRUPT, MAX_MIGRATE, MAX_MIGRATE_BYTES, OK, P, int, decimal, arg_int, later
--- @include QUARANTINE, META, LAYOUT, NS, OLD_IX, MAX_INT, of_type, LEASES_IX, READY_IX
--- @include deps_ix, ix_add, commit, check_layout, run_key, load, save
local count = arg_int(2, 1, MAX_MIGRATE)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local first = NS < LAYOUT
local from = NS
local got = redis.call('HMGET', META, 'migrate-cursor', 'migrate-moved')
local cursor, pass_moved = got[1], decimal(got[2] or '0', 0, MAX_INT)
if cursor and (not string.find(cursor, '^%d+$') or #cursor > 20) then
  return {CORRUPT, 'meta.migrate-cursor', 0, -1}
end
if not pass_moved then return {CORRUPT, 'meta.migrate-moved', 0, -1} end
-- A pass is needed from layout 1 (hash runs), and until the old index keys are empty.
if not cursor and (from == 1 or first or OLD_IX) then cursor, pass_moved = '0', 0 end
if not of_type(QUARANTINE, 'hash') then return {CORRUPT, 'quarantine', 0, -1} end
NS = LAYOUT
if first then
  later('HSET', META, 'layout', int(LAYOUT), 'old-ix', '1')
  OLD_IX = true
end
if not cursor then
  local bad_write = commit()
  if bad_write then return {CORRUPT, bad_write, 0, -1} end
  return {OK, {0, 1, 0, 0}, 0, -1}
end
local moved, damaged, entries = 0, 0, 0
local function old_page(ix, n)
  if not of_type(ix.old, 'zset') then return {} end
  return redis.call('ZRANGE', ix.old, 0, n - 1, 'WITHSCORES')
end
local leases = old_page(LEASES_IX, count)
local ready = #leases == 0 and old_page(READY_IX, math.max(1, math.floor(count / 4))) or {}
for i = 1, #leases, 2 do
  ix_add(LEASES_IX, leases[i], decimal(leases[i + 1], 0, MAX_INT) or 0)
  entries = entries + 1
end
local bytes = 0
for i = 1, #ready, 2 do
  local run, t = ready[i], decimal(ready[i + 1], 0, MAX_INT) or 0
  local s = load(run)
  -- A layout 1 run is rewritten whole: records of at most MAX_MIGRATE_BYTES a step.
  local size = s and s.v == 1 and redis.call('HSTRLEN', run_key(run), 'rec') or 0
  if entries > 0 and bytes + size > MAX_MIGRATE_BYTES then break end
  bytes = bytes + size
  if s and s.v == 1 then moved = moved + 1 end
  if s then
    -- The run's state says where its entry is (layout 4): keep it true.
    ix_add(READY_IX, run, t, s.rx)
    s.rt = t
    save(run, s)
  else
    ix_add(READY_IX, run, t)  -- a claim that meets it quarantines it
  end
  entries = entries + 1
end
if #leases > 0 or #ready > 0 then
  later('HSET', META, 'migrate-cursor', cursor, 'migrate-moved',
    int(pass_moved + moved + entries))
  local bad_write = commit()
  if bad_write then return {CORRUPT, bad_write, 0, -1} end
  return {OK, {moved, 0, 0, entries}, 0, -1}
end
-- SCAN's MATCH is a glob: the namespace's own *?[]\ are escaped.
local pattern = string.gsub(P, '([%*%?%[%]\\])', '\\%1') .. '[rd]:*'
local page = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', count)
local whole = true
for _, k in ipairs(page[2]) do
  local t = redis.call('TYPE', k)
  t = t.ok or t
  local kind = string.sub(k, #P + 1, #P + 2)
  if kind == 'r:' and t == 'hash' then
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
  elseif kind == 'd:' and t == 'set' then
    local ix = deps_ix(string.sub(k, #P + 3))
    local n = redis.call('SCARD', k)
    for _, w in ipairs(redis.call('SRANDMEMBER', k, count)) do ix_add(ix, w, 0) end
    entries = entries + math.min(n, count)
    if n > count then whole = false end
  end
end
local done = 0
if whole then cursor = page[1] end
pass_moved = pass_moved + moved + entries
if whole and cursor == '0' and pass_moved == 0 then
  later('HDEL', META, 'migrate-cursor', 'migrate-moved', 'old-ix')
  done = 1
elseif whole and cursor == '0' then
  -- A pass that moved anything is followed by another: a cursor kept across a restart or a
  -- failover means nothing to the new server process (SCAN may have skipped keys), so
  -- only a whole pass that finds nothing to move ends the migration.
  later('HSET', META, 'migrate-cursor', '0', 'migrate-moved', '0')
else
  later('HSET', META, 'migrate-cursor', cursor, 'migrate-moved', int(pass_moved))
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, {moved, done, damaged, entries}, 0, -1}
