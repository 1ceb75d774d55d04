-- runs.lua: one run's state: loaded and checked, saved, quarantined.

-- Runs read by this script, as planned after its queued writes (a run read twice, or the
-- dependency of a run written here, is seen as it will be); GONE: deleted here.
local SEEN = {}

local GONE = {}

-- The most takeovers a run counts (the count stops there).
local MAX_TAKEOVERS = 2147483648

-- One run's state: a table, or nil when absent, or false plus the field that is corrupt.
-- Numbers come back as numbers; every field is checked.
local function load(run)
  local cached = SEEN[run]
  if cached == GONE then return nil end
  if cached ~= nil then return cached end
  local s, bad = stored(run_key(run))
  if not s then return s, bad end
  s.rev = decimal(s.rev, 1, MAX_INT)
  if not s.rev then return false, 'rev' end
  if s.own then
    if s.own == '' then return false, 'own' end
    s.exp = decimal(s.exp, 0, MAX_INT)
    if not s.exp then return false, 'exp' end
  else
    s.own, s.exp = false, false
  end
  if s.cat then
    s.cat = decimal(s.cat, 0, MAX_INT)
    if not s.cat then return false, 'cat' end
    s.cdr = opt_decimal(s.cdr or '', 0, MAX_INT)
    if s.cdr == nil then return false, 'cdr' end
  else
    s.ck, s.cdr, s.cat = false, false, false
  end
  if s.wk then
    local wk = s.wk
    if wk ~= 'c' and wk ~= 'p' and wk ~= 'a' then return false, 'wk' end
    if wk ~= 'a' and (not s.wa or s.wa == '') then return false, 'wa' end
    if wk == 'a' then s.wa = false end
    if wk == 'c' then
      s.wn = opt_decimal(s.wn or '', 0, MAX_INT)
    elseif wk == 'p' then
      s.wn = decimal(s.wn, 1, MAX_INT)
    else
      s.wn = decimal(s.wn, 0, MAX_INT)
    end
    if s.wn == nil then return false, 'wn' end
    s.wdl = opt_decimal(s.wdl or '', 0, MAX_INT)
    if s.wdl == nil then return false, 'wdl' end
    s.wrev = decimal(s.wrev, 0, MAX_INT)
    if not s.wrev then return false, 'wrev' end
    s.wpv = decimal(s.wpv, 0, MAX_INT)
    if not s.wpv then return false, 'wpv' end
    s.pk = s.pk or false
    if s.pk and s.pk == '' then return false, 'pk' end
    s.pt = opt_decimal(s.pt or '', 0, MAX_INT)
    if s.pt == nil then return false, 'pt' end
  else
    s.wk, s.wa, s.wn, s.wdl, s.wrev, s.wpv, s.pk, s.pt = false, false, false, false, false,
      false, false, false
  end
  s.tk = decimal(s.tk or '0', 0, MAX_TAKEOVERS)
  if not s.tk then return false, 'tk' end
  if s.px and s.px ~= '1' then return false, 'px' end
  s.px = s.px == '1'
  s.rt = opt_decimal(s.rt or '', 0, MAX_INT)
  if s.rt == nil then return false, 'rt' end
  -- Where the run's index entries are before this script (its state changes as it runs).
  s.lx, s.rx = s.own and s.exp, s.rt
  SEEN[run] = s
  return s
end

-- The record of a run load returned.
local function record_of(run, s)
  local k = run_key(run)
  if s.v == 1 then return redis.call('HGET', k, 'rec') end
  if s.len == 0 then return '' end
  return redis.call('GETRANGE', k, 0, s.len - 1)
end

-- Queue the write of run's state s (and of its new record, if given) in the namespace's
-- layout. Layout 2 rewrites only the header region (SETRANGE after the record) unless the
-- record changes or the run is still a layout 1 hash (read its record now: a write comes
-- only after every read). A header that shrinks leaves room; one that grows extends it.
local function save(run, s, record)
  local k = run_key(run)
  SEEN[run] = s
  if NS == 1 then
    local set, del = {}, {}
    if record then push(set, 'rec', record) end
    local function put(name, value)
      if value then push(set, name, value) else push(del, name) end
    end
    put('rev', int(s.rev))
    put('own', s.own)
    put('exp', s.own and int(s.exp))
    put('ck', s.cat and (s.ck or ''))
    put('cdr', s.cat and opt_text(s.cdr))
    put('cat', s.cat and int(s.cat))
    put('wk', s.wk)
    put('wa', s.wk and (s.wa or ''))
    put('wn', s.wk and opt_text(s.wn))
    put('wdl', s.wk and opt_text(s.wdl))
    put('wrev', s.wk and int(s.wrev))
    put('wpv', s.wk and int(s.wpv))
    put('pk', s.wk and s.pk)
    put('pt', s.wk and s.pk and s.pt and int(s.pt))
    if #del > 0 then later('HDEL', k, unpack(del)) end
    later('HSET', k, unpack(set))
    return
  end
  local h = header(s)
  if not record and s.v ~= 2 then record = redis.call('HGET', k, 'rec') end
  if record then
    -- The record as it came, then the header after it: joining them in Lua first would
    -- copy the record once more (a 2 MiB record: 6-9 ms more, measured).
    later('SET', k, record)
    later('SETRANGE', k, #record, h .. trailer(#h))
    s.v, s.len, s.region = 2, #record, #h
  elseif #h <= s.region then
    later('SETRANGE', k, s.len, h .. string.rep(' ', s.region - #h))
  else
    later('SETRANGE', k, s.len, h .. trailer(#h))
    s.region = #h
  end
end

-- A dependency's revision as planned (0 when absent; a corrupt one counts as absent: a
-- waiter of it stays discoverable by its deadline and by the dependency's repair).
local function revision_of(run)
  local s = load(run)
  if s then return s.rev end
  return 0
end

-- Move an index entry whose run is missing, of the wrong type or corrupt to the quarantine.
local function quarantine(ix, run, reason)
  ix_rem(ix, run, not ix.scored and 0 or nil)
  later('HSET', QUARANTINE, ix.label .. '|' .. run, reason)
  DROPPED = DROPPED + 1
end

-- The highest revision a deleted run of the namespace had (0: none), or nil when the meta
-- field is damaged. insert starts above it, so no revision of an id is ever used twice.
local function deleted_rev()
  return decimal(redis.call('HGET', META, 'deleted-rev') or '0', 0, MAX_INT - 2)
end

-- Whether key (of a type whose members cannot be sized before they are read: a hash's
-- fields, a sorted set's members), holding count elements, takes at most limit bytes, by
-- MEMORY USAGE: every element counted when there are at most MAX_PARTITIONS (one big
-- member hides from a sample of 5), else sampled (O(1); a big member among many may pass).
-- A server without the command (or a user denied it) skips the guard.
local function within(key, limit, count)
  local n
  if count <= MAX_PARTITIONS then
    n = redis.pcall('MEMORY', 'USAGE', key, 'SAMPLES', 0)
  else
    n = redis.pcall('MEMORY', 'USAGE', key)
  end
  return type(n) ~= 'number' or n <= limit
end

-- A key of the dependencies across partitions found damaged (of another type, or over its
-- bound): queued to be renamed aside to P.."damaged:"..name..":"..time (a fresh one takes
-- its place; a time of its own, so no rename overwrites, and so deletes, a big key) and
-- listed in the quarantine as "damaged|"..name (store.quarantined() names it).
local function set_aside(name, reason)
  local key = P .. name
  later('RENAME', key, P .. DAMAGED_KEY .. name .. ':' .. int(now_ms()))
  later('HSET', QUARANTINE, 'damaged|' .. name, reason)
  TYPES[key] = 'none'
end

-- The run at revision expected, or nil and the reply that refuses the call.
local function load_at(run, expected)
  local s, bad = load(run)
  if s == nil then return nil, {NOT_FOUND, false, 0, -1} end
  if s == false then return nil, {CORRUPT, bad, 0, -1} end
  if s.rev ~= expected then return nil, {CONFLICT, s.rev, 0, -1} end
  return s
end
