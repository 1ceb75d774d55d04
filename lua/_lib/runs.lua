-- runs.lua: one run's state: loaded and checked, saved, quarantined.

-- Runs read by this script, as planned after its queued writes (a run read twice, or the
-- dependency of a run written here, is seen as it will be); GONE: deleted here.
local SEEN = {}

local GONE = {}

-- One run's state (codec.lua's stored): a table, or nil when absent, or false plus the
-- field that is corrupt. Read once per script; later reads see it as this script left it.
local function load(run)
  local cached = SEEN[run]
  if cached == GONE then return nil end
  if cached ~= nil then return cached end
  local s, bad = stored(run_key(run))
  if not s then return s, bad end
  -- A session's run: its lease expires with the session (one that is gone, or another
  -- owner's, a header no grant writes: long ago).
  if s.sid then
    local sn = SESSION.of(int(s.sid))
    s.exp = sn and sn.owner == s.own and sn.exp or 0
  end
  -- Where the run's index entries are before this script (its state changes as it runs):
  -- its lease entry (poison runs have none), and whether the ready index may hold it.
  s.lx = s.own and s.px ~= 'p' and s.exp
  s.rx = not s.own and s.wk and true or false
  SEEN[run] = s
  return s
end

-- The state of a run about to be inserted (no lease, no wait, no counters), its last grant
-- token tok: the write that creates it sets the rest.
local function fresh(tok)
  return {own = false, exp = false, tok = tok, ck = false, cdr = false, cat = false,
          wk = false, wa = false, wn = false, wdl = false, wrev = false, wpv = false,
          pt = false, tk = 0, at = 0, nb = false, px = false, sid = false, lx = false,
          rx = false, len = 0, region = 0, tail = false}
end

-- The record of a run load returned, or nil when its length passes the ceiling a store may
-- write (a value planted beside the header: it is never copied into the script).
local function record_of(run, s)
  if s.len > MAX_RECORD_CEILING then return nil end
  if s.len == 0 then return '' end
  if s.tail then return string.sub(s.tail, 1, s.len) end
  return redis.call('GETRANGE', run_key(run), 0, s.len - 1)
end

-- Queue the write of run's state s (and of its new record, if given). Without a record only
-- the header region is rewritten (SETRANGE after the record, whatever the record's size): a
-- header that shrinks leaves room, one that grows extends it.
local function save(run, s, record)
  local k = run_key(run)
  SEEN[run] = s
  local h = header(s)
  if record then
    put_run(k, record, h)
    s.len, s.region, s.tail = #record, #h, false
  elseif #h <= s.region then
    later('SETRANGE', k, s.len, h .. string.rep(' ', s.region - #h))
  else
    later('SETRANGE', k, s.len, h .. trailer(#h))
    s.region = #h
  end
end

-- Move an index entry whose run is missing, of the wrong type or corrupt to the quarantine.
local function quarantine(ix, run, reason)
  ix_rem(ix, run)
  later('HSET', QUARANTINE, ix.label .. '|' .. run, reason)
  DROPPED = DROPPED + 1
end

-- The highest revision and grant token a deleted run of the namespace had (0: none), or nil
-- and the field when one is damaged: insert starts above both, so no revision or token of
-- an id is ever used twice. Both fields are sized, then read in one call (HSTRLEN cannot
-- tell an empty field, which is no number, from an absent one).
local function deleted_floor()
  local fields = {'deleted-rev', 'deleted-tok'}
  for i = 1, 2 do
    if redis.call('HSTRLEN', META, fields[i]) > 16 then return nil, 'meta.' .. fields[i] end
  end
  local raw = redis.call('HMGET', META, fields[1], fields[2])
  local got = {0, 0}
  for i = 1, 2 do
    if raw[i] then
      got[i] = decimal(raw[i], 0, MAX_INT - 2)
      if not got[i] then return nil, 'meta.' .. fields[i] end
    end
  end
  return got[1], got[2]
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
