-- partitions.lua: dependencies across partitions: mirrors, watches, the outbox, unwatching.

-- Dependency -> its mirror entry as this script knows it ({v, s, d}; false: none).
local MIRROR = {}

-- Whether this script met a mirror entry too big to overwrite (see mirror_of).
local BIG_MIRROR = false

-- A mirror entry's text: "v|s|d" (d '' when unknown), or a bare version (written before
-- watches were numbered: s 0, d unknown). {v, s, d}, or nil when damaged.
local function parse_mirror(raw)
  local v = decimal(raw, 0, MAX_INT)
  if v then return {v = v, s = 0, d = false} end
  local a, b, c = string.match(raw, '^(%d+)|(%d+)|(%d*)$')
  if not a then return nil end
  v, b = decimal(a, 0, MAX_INT), decimal(b, 0, MAX_INT)
  local d = false
  if c ~= '' then d = decimal(c, 0, MAX_PARTITIONS - 1) end
  if not v or not b or d == nil then return nil end
  return {v = v, s = b, d = d}
end

-- The mirror entry of dep (false: none, not a partition, or a damaged entry, which then
-- reads as absent: at worst a waiter becomes claimable early, never lost). An entry is
-- sized (HSTRLEN) before it is read.
local function mirror_of(dep)
  if not PARTITION then return false end
  local m = MIRROR[dep]
  if m == nil then
    m = false
    if of_type(DEPV, 'hash') and TYPES[DEPV] ~= 'none' then
      local n = redis.call('HSTRLEN', DEPV, dep)
      if n > 0 and n <= 40 then m = parse_mirror(redis.call('HGET', DEPV, dep)) or false end
      -- A big field (planted) is never overwritten, which would free it in this script:
      -- the next write of the mirror sets the whole hash aside instead (a rename).
      if n > 65536 then BIG_MIRROR = true end
    end
    MIRROR[dep] = m
  end
  return m
end

-- The mirror's version of dep (false: none).
local function mirrored(dep)
  local m = mirror_of(dep)
  return m and m.v
end

-- Raise the mirror's version of dep to v (queued), noting watch s of it (0: none) and its
-- partition d (false: unknown); true when the version rose.
local function raise_mirror(dep, v, s, d)
  -- A mirror of another type (it read as empty) is set aside, and this write starts anew.
  if not of_type(DEPV, 'hash') then set_aside('depv', 'type') end
  local cur = mirror_of(dep)
  if BIG_MIRROR then
    set_aside('depv', 'size')
    BIG_MIRROR, MIRROR, cur = false, {}, false
  end
  local m = {v = v, s = s or 0, d = d or false}
  if cur then
    if cur.v > m.v then m.v = cur.v end
    if cur.s > m.s then m.s = cur.s end
    if not m.d then m.d = cur.d end
    if m.v == cur.v and m.s == cur.s and m.d == cur.d then return false end
  end
  MIRROR[dep] = m
  later('HSET', DEPV, dep, int(m.v) .. '|' .. int(m.s) .. '|' .. (m.d and int(m.d) or ''))
  return not cur or cur.v < v
end

-- The revision a waiter reads of its dependency: the run's own when it is here; else, for
-- one in another partition, the mirror's (a mirror entry of a run that is here, left by a
-- repartition or a foreign write, is never read); else 0.
local function dep_revision(dep)
  local s = load(dep)
  if s then return s.rev end
  local v = mirrored(dep)
  if v and v % 2 == 0 then return v / 2 end
  return 0
end

-- The version of run here, for a watcher in another partition: 2 * its revision, or
-- 2 * deleted-rev + 1 when absent (deleted, or never written: read as revision 0, and
-- below any later insert's version).
local function version_of(run)
  local s = load(run)
  if s then return 2 * s.rev end
  return 2 * (deleted_floor() or 0) + 1
end

-- The partitions watching run here: its watch key is a hash partition -> watch number (of
-- at most MAX_PARTITIONS fields, a few bytes each; "*": every partition, left where a
-- damaged key was); nil when the key is of another type, over its bounds or holds a field
-- that is not ours (damaged: see announce).
local function watchers(run)
  local key = P .. WATCH_KEY .. run
  if not of_type(key, 'hash') then return nil end
  if TYPES[key] == 'none' then return {} end
  local fields = redis.call('HLEN', key)
  if fields > MAX_PARTITIONS or not within(key, 65536, fields) then return nil end
  local out = {}
  for _, w in ipairs(redis.call('HKEYS', key)) do
    if w ~= '*' and not decimal(w, 0, MAX_PARTITIONS - 1) then return nil end
    out[#out + 1] = w
  end
  return out
end

-- run's watch key, found damaged: set aside, and replaced by "every partition watches"
-- (a claim delivering "*|"..run turns it into a watch of each partition, which the unwatch
-- protocol then prunes). The watchers to announce to: every partition.
local function rewatch_all(run)
  set_aside(WATCH_KEY .. run, 'damaged')
  later('HSET', P .. WATCH_KEY .. run, '*', '0')
  return {'*'}
end

-- A write of run (version v) that other partitions' runs wait on: queue an outbox entry
-- for each (a claim delivers them) and a wake-up token (a blocked claimer claims, and
-- delivers). A damaged watch key announces to every partition ("*|"..run: see
-- rewatch_all); an outbox of another type is set aside and this entry starts a new one.
local function announce(run, v)
  if not PARTITION then return end
  local ws = watchers(run) or rewatch_all(run)
  if #ws == 0 then return end
  if not of_type(OUTBOX, 'zset') then set_aside('outbox', 'type') end
  local any = false
  for _, w in ipairs(ws) do
    local member = w .. '|' .. run
    local old = TYPES[OUTBOX] ~= 'none' and tonumber(redis.call('ZSCORE', OUTBOX, member))
    if not old or old < v then
      later('ZADD', OUTBOX, v, member)
      any = true
    end
  end
  if any then queue_token(SIGNALS, WAKE_READY, '~outbox') end
end

-- The highest watch toward partition d that an unwatch begun here covered (0: none), or
-- nil when the unwatched key or its field is damaged.
local function unwatched_of(d)
  if not of_type(UNWATCHED, 'hash') then return nil end
  local n = redis.call('HSTRLEN', UNWATCHED, int(d))
  if n == 0 then return 0 end
  if n > 16 then return nil end
  return decimal(redis.call('HGET', UNWATCHED, int(d)), 0, MAX_INT)
end

-- Whether no run here waits on dep once this script's changes are made, leaving: a run
-- this script takes out of dep's waiters (nil: none).
local function idle(dep, leaving)
  local ix = deps_ix(dep)
  if not of_type(ix.key, 'set') then return false end
  local n = redis.call('SCARD', ix.key)
  return n == 0 or (n == 1 and leaving ~= nil
                    and redis.call('SISMEMBER', ix.key, leaving) == 1)
end

-- dep, of partition d, has no waiters here any more: its mirror entry goes, unwatched[d]
-- rises to seq (the latest watch of dep known here) and the unwatch of seq is queued for a
-- claim to send to d (run_unwatch removes the watch there only if it is still seq: a newer
-- watcher's stays). A waiter that watched before, and writes after, finds no entry and a
-- watch not above unwatched[d]: it watches again (REWATCH). Nothing is done while the keys
-- it needs are damaged (the watch stays: writes of dep are still announced here).
local function unwatch(dep, d, seq)
  if not d or not of_type(DEPV, 'hash') then return end
  local u = unwatched_of(d)
  if u == nil then return end
  if mirror_of(dep) and BIG_MIRROR then
    set_aside('depv', 'size')
    BIG_MIRROR, MIRROR = false, {}
  end
  if not of_type(UNWATCH_Q, 'zset') then set_aside('unwatch', 'type') end
  if mirror_of(dep) then
    later('HDEL', DEPV, dep)
    MIRROR[dep] = false
  end
  if seq == 0 then return end
  if seq > u then later('HSET', UNWATCHED, int(d), int(seq)) end
  local member = int(d) .. '|' .. dep
  local old = TYPES[UNWATCH_Q] ~= 'none' and tonumber(redis.call('ZSCORE', UNWATCH_Q, member))
  if not old or old < seq then later('ZADD', UNWATCH_Q, seq, member) end
end

-- A waiter's write whose wait w carries a watch (w.ws in partition w.wd) that no mirror
-- entry covers and that an unwatch begun here may have undone: the reply that refuses it
-- (REWATCH, payload the unwatched watch: nothing written; the store watches again, above
-- it, and sends the write again), or nil.
-- A damaged unwatched key (another type, a field not a number) answers REWATCH with -1
-- to a first try: unwatch begins nothing while it is damaged, so a watch made after that
-- answer (w.again) is newer than every unwatch begun here and goes through.
local function rewatch(w)
  if not w.watched or not w.ws or mirror_of(w.wa) then return nil end
  local u = unwatched_of(w.wd)
  if u == nil then
    if w.again then return nil end
    return {REWATCH, -1, 0, -1}
  end
  if w.ws <= u then return {REWATCH, u, 0, -1} end
  return nil
end
