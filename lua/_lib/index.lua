-- index.lua: the run indexes and the changes a script queues to them.

-- The most entries a layout 4 bucket holds after a split: Redis keeps a sorted set of at
-- most 128 entries (zset-max-listpack-entries) as one listpack, about 50 bytes an entry
-- instead of about 150 in a skiplist.
local BUCKET_MAX = 128

local BUCKET_HALF = 64

-- A run index: before layout 4, the one key old (a sorted set run -> score, or a set of
-- waiters); from layout 4, buckets. A bucket is a sorted set holding the entries whose
-- composite (composite) lies in its range: from its lower bound up to the next bucket's.
-- The directory dir (a sorted set, every score 0, ordered by member) holds every lower
-- bound but the first, ''; the bucket of bound b is pre .. b. name: the index in a CORRUPT
-- reply ('index:' .. name); label: in the quarantine.
local function index(old, kind, name, label, base)
  return {old = old, kind = kind, name = name, label = label, dir = base .. BUCKET_DIR,
          pre = base .. BUCKET_AT, scored = kind == 'zset', unindex = kind == 'zset' and 'ZREM' or 'SREM'}
end

local LEASES_IX = index(LEASES, 'zset', 'leases', 'leases', P .. LEASES_BUCKETS)

local READY_IX = index(READY, 'zset', 'ready', 'ready', P .. READY_BUCKETS)

local DEPS_IX = {}

-- The name every key of dep's waiters index starts with (layout 4): the length of dep in
-- it keeps every dependency's keys apart.
local function deps_base(dep)
  return P .. DEPS_BUCKETS .. #dep .. DEPS_SEP .. dep
end

-- Whether any run may wait for run to change (layout 4, no migration under way): its
-- waiters index has a first bucket or a directory.
local function waited_on(run)
  local base = deps_base(run)
  return redis.call('EXISTS', base .. BUCKET_AT, base .. BUCKET_DIR) > 0
end

-- The index of the runs waiting for dep to change (scores all 0: ordered by run id).
local function deps_ix(dep)
  local ix = DEPS_IX[dep]
  if not ix then
    ix = index(P .. DEPS_KEY .. dep, 'set', 'd', 'd:' .. dep, deps_base(dep))
    DEPS_IX[dep] = ix
  end
  return ix
end

-- An entry's place in its index's order as one string: the score as 16 digits (scores are
-- integers in [0, MAX_INT]), then the run id; the run id alone where scores are all 0. The
-- server compares these (ZRANGEBYLEX), never Lua: its strings compare by the locale.
local function composite(ix, score, run)
  if not ix.scored then return run end
  local d = int(score)
  return string.rep('0', 16 - #d) .. d .. run
end

-- Index changes queued for commit (layout 4), per index in first use order. rem: run -> the
-- score its entry has before this script (false: none); add: run -> its score after (false:
-- none); found: run -> the score a claim found its entry at (false: in the old key); at:
-- run -> the bound of the bucket it was found in; dropped: bounds of buckets of another
-- type, dropped from the directory by this script.
local IXQ = {}

local IXS = {}

local function ix_queue(ix)
  local q = IXQ[ix.dir]
  if not q then
    q = {ix = ix, rem = {}, add = {}, found = {}, at = {}, runs = {}, dropped = {}, ndropped = 0}
    IXQ[ix.dir] = q
    IXS[#IXS + 1] = q
  end
  return q
end

local function ix_change(ix, run, old, new)
  local q = ix_queue(ix)
  if q.rem[run] == nil then
    q.runs[#q.runs + 1] = run
    local f = q.found[run]
    if f ~= nil then old = f end
    q.rem[run] = old or false
  end
  q.add[run] = new
end

-- Take run out of index ix, where it had score old before this script (nil or false: it had
-- no entry, as far as the run's state says; a claim's find overrides).
local function ix_rem(ix, run, old)
  if NS < 4 or OLD_IX then later(ix.unindex, ix.old, run) end
  if NS >= 4 then ix_change(ix, run, old, false) end
end

-- Put run in index ix at score (moving it from score old, as ix_rem).
local function ix_add(ix, run, score, old)
  if NS < 4 then
    if ix.scored then later('ZADD', ix.old, int(score), run) else later('SADD', ix.old, run) end
    return
  end
  if OLD_IX then later(ix.unindex, ix.old, run) end
  ix_change(ix, run, old, score)
end

-- Bucket key -> its entry count, read at most once and then kept as this script plans
-- (false: of another type). The read checks the type, and tells commit whether a bucket
-- fills (split) or empties (leaves the directory) without another read.
local CARDS = {}

local function card_of(key)
  local n = CARDS[key]
  if n == nil then
    local r = redis.pcall('ZCARD', key)
    n = r
    if type(r) == 'table' then
      wrong_type(r)  -- not a type error (a key on another node...): aborts, nothing written
      n = false
    end
    CARDS[key], READ[key] = n, true
  end
  return n
end
