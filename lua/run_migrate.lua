-- run_migrate: one bounded step of moving a namespace an earlier library wrote (layouts 1 to
-- 4) to layout 5, offline: every other script refuses it (TOO_OLD) until the step that
-- ends the migration records layout 5.
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] SCAN COUNT of this step (at most MAX_MIGRATE)
-- Reply    {OK, {runs moved, done 0|1, damaged, index entries moved}} | {TOO_NEW, layout}
--          | {CORRUPT, field} | {PARTITIONED, count} | {UNCOUNTED}
-- A namespace at layout 5, or a new one (no layout recorded, no index keys), is done at
-- once: a new one's layout is recorded. Else a step visits one SCAN page of the namespace's
-- keys from meta's migrate-cursor: each run key of layouts 1 to 4 is rewritten in layout 5
-- (records of at most MAX_MIGRATE_BYTES a step, at least one run; old.lua says how each
-- field goes), one already in layout 5 is passed over, a damaged one left as it is and
-- listed in the quarantine as "migrate|run"; the entries of layout 4's buckets go to the
-- flat indexes, and its buckets and directories go (at most MAX_MIGRATE_ENTRIES a step).
-- A page cut short by a budget is visited again. A pass ends when SCAN's cursor comes back
-- to 0; one that moved anything is followed by another (a cursor kept across a restart or
-- a failover means nothing to the new server process: SCAN may have skipped keys), and the
-- first that moves nothing ends the migration: meta records layout 5 (layout, v5) and
-- drops the cursor, the pass's count (migrate-pass) and old-ix; from layout 4, the fan-out
-- cursors go too (a pending fan-out starts its waiters' set over). A cursor an earlier
-- library's migration left (without migrate-pass) is not resumed: the first pass starts
-- at 0. Writes are queued and sent at the end, the meta's first (under maxmemory the
-- server refuses the step before it writes anything).
-- Also touches, undeclared (same hash tag): P.."r:"..run of each run its page finds, the
-- buckets and directories of layout 4's indexes it finds (P.."L|"..bound, P.."L/",
-- P.."Q|"..bound, P.."Q/", P.."D"..n..":"..dep.."|"..bound, P.."D"..n..":"..dep.."/"),
-- P.."leases", P.."ready" and P.."d:"..dep (the entries moved; with no layout recorded,
-- the first two are read), P.."quarantine" (a damaged run), P.."fanout-cursor".
--- @include CORRUPT, OK, TOO_OLD, MAX_MIGRATE, MAX_MIGRATE_BYTES, MAX_MIGRATE_ENTRIES
--- @include MAX_RECORD_CEILING, MAX_INT, LAYOUT, P, META, QUARANTINE, FANOUT_CURSOR, RUN_KEY
--- @include FEED_STATE
--- @include LEASES_BUCKETS, READY_BUCKETS, DEPS_BUCKETS, RECORDED, WRITES, TYPES, READ
--- @include int, decimal, arg_int, later, of_type, check_layout, commit, writes_ok
--- @include touch_writes, coalesced, save, old_hash, old_string, old_state, old_index
local count = arg_int(2, 1, MAX_MIGRATE)
local refused = check_layout()
if refused and refused[1] ~= TOO_OLD then return refused end
if not refused then
  -- Layout 5 already, or a new namespace: commit records its layout.
  if not RECORDED and not FEED_STATE.max then later('HSETNX', META, 'v5', '1') end
  local bad_write = commit()
  if bad_write then return {CORRUPT, bad_write, 0, -1} end
  return {OK, {0, 1, 0, 0}, 0, -1}
end
local from = refused[2]
for _, field in ipairs({'migrate-cursor', 'migrate-pass'}) do
  if redis.call('HSTRLEN', META, field) > 20 then return {CORRUPT, 'meta.' .. field, 0, -1} end
end
local got = redis.call('HMGET', META, 'migrate-cursor', 'migrate-pass', 'layout')
local cursor, pass = '0', 0
if got[2] then
  cursor, pass = got[1] or '0', decimal(got[2], 0, MAX_INT)
  if not pass then return {CORRUPT, 'meta.migrate-pass', 0, -1} end
  if not string.find(cursor, '^%d+$') then return {CORRUPT, 'meta.migrate-cursor', 0, -1} end
end
-- SCAN's MATCH is a glob: the namespace's own *?[]\ are escaped. Run keys and layout 4's
-- index keys start with these letters (so do a few others: passed over by name).
local pattern = string.gsub(P, '([%*%?%[%]\\])', '\\%1') .. '[' .. string.sub(RUN_KEY, 1, 1)
  .. LEASES_BUCKETS .. READY_BUCKETS .. DEPS_BUCKETS .. ']*'
local page = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', count)
local moved, damaged, entries, bytes, work, whole = 0, 0, 0, 0, 0, true
for _, k in ipairs(page[2]) do
  local rest, t = string.sub(k, #P + 1), 'none'
  -- A key SCAN gives twice (while the server rehashes) is visited once: the writes queued
  -- for it are not made yet, so it would read as it was.
  if not READ[k] then
    t = redis.call('TYPE', k)
    t = t.ok or t
    TYPES[k], READ[k] = t, true
  end
  if t == 'none' then
    -- Gone since SCAN named it (expired), or a duplicate: nothing to do.
  elseif string.sub(rest, 1, #RUN_KEY) == RUN_KEY then
    local run, raw, bad, s = string.sub(rest, #RUN_KEY + 1), nil, nil, nil
    if t == 'hash' then
      raw, bad = old_hash(k)
    elseif t == 'string' then
      raw, bad = old_string(k)
    else
      bad = 'type'
    end
    if raw and raw ~= true then
      s, bad = old_state(raw)
      -- A record longer than any store writes: layout 5 would never read it.
      if s and raw.len > MAX_RECORD_CEILING then s, bad = false, 'record' end
    end
    if s and bytes > 0 and bytes + raw.size > MAX_MIGRATE_BYTES then
      whole = false
      break
    end
    if s then
      bytes = bytes + raw.size
      if raw.region then
        s.len, s.region = raw.len, raw.region
        save(run, s)
      else
        save(run, s, redis.call('HGET', k, 'rec'))
      end
      moved = moved + 1
    elseif bad then
      if not of_type(QUARANTINE, 'hash') then return {CORRUPT, 'quarantine', 0, -1} end
      -- Counted once, though a page cut by a budget, and every pass, visits it again.
      if redis.call('HEXISTS', QUARANTINE, 'migrate|' .. run) == 0 then
        damaged = damaged + 1
      end
      later('HSET', QUARANTINE, 'migrate|' .. run, bad)
    end
  else
    local ix, dir = old_index(rest)
    if ix and t == 'zset' then
      local n = redis.call('ZCARD', k)
      local take = math.min(n, MAX_MIGRATE_ENTRIES - work)
      if take > 0 and not dir then
        local moving = redis.call('ZRANGE', k, 0, take - 1, 'WITHSCORES')
        for i = 1, #moving, 2 do
          if ix.scored then
            later('ZADD', ix.key, moving[i + 1], moving[i])
          else
            later('SADD', ix.key, moving[i])
          end
        end
        entries = entries + take
      end
      work = work + take
      if take == n then
        later('DEL', k)
      else
        if take > 0 then later('ZREMRANGEBYRANK', k, 0, take - 1) end
        whole = false
      end
    end
  end
end
if whole then cursor = page[1] end
pass = pass + moved + entries
local first, done = nil, 0
if whole and cursor == '0' and pass == 0 then
  first = {'HSET', META, 'layout', int(LAYOUT), 'v5', '1'}
  if FEED_STATE.max then first = {'HSET', META, 'layout', int(LAYOUT)} end
  later('HDEL', META, 'migrate-cursor', 'migrate-pass', 'migrate-moved', 'old-ix')
  if from == 4 and of_type(FANOUT_CURSOR, 'hash') then later('DEL', FANOUT_CURSOR) end
  done = 1
else
  if whole and cursor == '0' then pass = 0 end
  first = {'HSET', META, 'migrate-cursor', cursor, 'migrate-pass', int(pass)}
  -- Found by its index keys: recorded, so that it is refused whatever they come to hold.
  if not got[3] then first[#first + 1], first[#first + 2] = 'layout', int(from) end
end
table.insert(WRITES, 1, first)
local bad_write = writes_ok()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
touch_writes()
for _, w in ipairs(coalesced()) do redis.call(unpack(w)) end
return {OK, {moved, done, damaged, entries}, 0, -1}
