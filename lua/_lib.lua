-- _lib.lua: shared fragments of the run store's scripts. redisstore.scripts sends each
-- script with the fragments it uses (a fragment is one top-level `local` definition, with
-- the comment lines right above it, up to the next one), so a script pays only for what it
-- calls.
--
-- The build (redisstore/scripts.py's docstring has it all). A script's header ends with
--   --- @include name, name, ...      (one or more lines; a bare `--- @include`: none)
-- naming every fragment of this file its body uses directly, constants and reply codes
-- too; each included fragment brings the fragments it uses, found by use (a fragment
-- declares nothing). Loading fails, listing every problem as file:line, when a body uses a
-- name it does not include, includes one it does not use or that is not here, or uses a
-- name defined nowhere; or when a fragment here uses a name defined below it (a Lua local
-- is visible only after its definition). The header's KEYS[i] lines name the keys the
-- caller sends (P.."leases"); any other key a script touches is derived from P, in the same
-- hash tag and so the same cluster slot, and listed in its `Also touches` line. The reply
-- codes OK ... TOO_NEW are generated from redisstore.scripts.Code: never define them here.
-- An error raised here reaches the caller as _lib.lua:<line>, not the composed line.
--
-- Rules every script follows:
--   Check, then write. A script does every read and every validation first and only
--   queues its writes (later); commit() sends them at the very end. Redis never rolls a
--   failed script back, so a script that returns an error or a refusal has written
--   nothing, and a runaway script stays killable (SCRIPT KILL works until the first write).
--   Trust nothing. Every ARGV number and every stored number must be a canonical decimal
--   integer in range (tonumber alone takes '0x10', ' 5 ', '1e3', 'nan'). A run whose stored
--   data fails is corrupt: the operation on it answers CORRUPT with the field; an index
--   entry that leads to a missing, wrong-type or corrupt run is moved to the quarantine
--   (hash P.."quarantine": "index|run" -> reason) and the claim goes on with the others.
--   Bounded work. Every loop visits at most a capped number of entries (see the caps).
--   ARGV[1] is the namespace's key prefix "{ns}:" (one hash tag: one cluster slot).
--   Time is read from the server (TIME), once per script and only when a decision needs it.
--
-- Replies: {code, payload, dropped, wait}. code: OK 0, NOT_FOUND 1, EXISTS 2,
-- CONFLICT 3 (payload: stored revision), REFUSED 4 (payload: {owner|false, live 0|1}),
-- CORRUPT 7 (payload: the field), TOO_NEW 8 (payload: the namespace's layout), TOO_OLD 9
-- (payload: the namespace's layout, below what the call needs), PARTITIONED 10 (payload: the
-- partition count a store of partitions recorded in this meta key, or that a partition
-- records and the caller's is not), UNCOUNTED 11 (a partition that records no count, to a
-- caller that has not checked the namespace's: nothing written). dropped:
-- index entries moved to the quarantine by this call. wait (claims only, else -1): ms until
-- the index has a claimable entry (0: now, -1: nothing indexed), see wait_after_claim. Bad arguments raise an error whose text starts
-- "BADARG" (a plain string: Redis 6.2 cannot raise a table), before anything is written.
--
-- Per-run hash P.."r:"..run (layout 1):
--   rec, rev            the record bytes and its revision
--   own, exp            lease owner and expiry (absent while free)
--   ck, cdr, cat        claim info of a ready claim: key ('' none), dependency revision
--                       ('' none), backend claim time; absent when there is none
--   wk, wa, wn, wdl     the discovered wait: kind ('c' Changed, 'p' Poll, 'a' At),
--                       dependency or poll key, seen / interval / due ('' none), deadline
--   wrev, wpv           revision and projection version the wait was derived from
--   pk, pt              the poll key whose last ready claim time pt is saved
--   tk, px              layout 3 only: takeovers since the last write (absent: 0), and
--                       1 while the run is quarantined as poison (absent: not)
-- Indexes: P.."leases" (zset run -> lease expiry, held runs only), P.."ready" (zset run ->
-- backend time the run is eligible from; free runs with a wait only), P.."d:"..dep (set of
-- runs whose wait is Changed(dep)), P.."fanout" (zset dep -> time: dependencies whose
-- waiters are still to be re-indexed, P.."fanout-cursor" their SSCAN cursors).
-- Wake-ups: P.."wake-ready" and P.."wake-leases" (zsets of at most MAX_WAKE tokens, each a
-- run id, or "#" and the SHA1 of an id longer than 64 bytes, scored by the time of the
-- signal): a write that makes a run claimable now, or due earlier than the index's head,
-- adds the run's token; a claim removes the tokens of the runs it takes and, when it leaves
-- claimable work behind, adds one. Signals are sent after the writes, each as a pcall. Blocked claimers pop them with BZPOPMIN
-- (a partition's also publish on the sharded channel of the key's name). A wake key of
-- another type only turns signals off: blocked claimers then claim again within their
-- re-arm period, as they do for writers of library versions that never signal.
-- P.."meta" (hash): layout, the namespace's layout version (absent: 1); deleted-rev, the
-- highest revision a deleted run had (absent: 0), above which insert starts.

local LEASES = P .. 'leases'

local READY = P .. 'ready'

local QUARANTINE = P .. 'quarantine'

local FANOUT = P .. 'fanout'

local FANOUT_CURSOR = P .. 'fanout-cursor'

local META = P .. 'meta'

local WAKE_READY = P .. 'wake-ready'

local WAKE_LEASES = P .. 'wake-leases'

-- A partition of a store spread over partitions (its prefix is {ns#p}: '#' is reserved in
-- namespace names). Its dependencies in other partitions are known by a mirror, and its
-- runs that others' runs wait on announce their writes (redisstore.partitions,
-- docs/design/partitions.md "Dependencies across partitions"):
-- P.."depv" (hash): dependency in another partition -> its mirror entry "v|s|d": v its
-- version as last delivered here (2 * revision, plus 1 once deleted: each write of it has a
-- higher one), s the highest watch of it this entry covers, d its partition;
-- P.."unwatched" (hash): partition d -> the highest watch an unwatch begun here toward d
-- covered (a waiter's write whose watch is not above it, with no mirror entry, watches
-- again: REWATCH);
-- P.."unwatch" (sorted set): "<partition>|<run>" -> the watch to remove there (claims send
-- them: run_unwatch);
-- P.."watch:"..run (hash): partition with a run waiting on run -> its latest watch;
-- P.."watch-seq" (string): the last watch number given here (run_watch);
-- P.."outbox" (sorted set): "<partition>|<run>" -> the version of run to deliver there.
local PARTITION = string.find(P, '#', 1, true) ~= nil

local DEPV = P .. 'depv'

local OUTBOX = P .. 'outbox'

local UNWATCHED = P .. 'unwatched'

local UNWATCH_Q = P .. 'unwatch'

-- The newest layout this library reads and writes; a namespace with a newer one is refused.
local LAYOUT = 4

-- The namespace's layout (check_layout reads it): 1, one hash per run; 2, one string per
-- run; 3, layout 2 with deletes and poison runs (tk, px, deleted-rev); 4, layout 3 with
-- bucketed indexes (see index). A namespace stays at 1 until migrate() moves it. A
-- partition's keys ({ns#p}) began at layout 4: no older library wrote them, so one with no
-- layout recorded is at 4 (not LAYOUT: a later library must still see 4 there and migrate
-- it), and its migration is done without a SCAN of the server's keys.
local NS = PARTITION and 4 or 1

-- Layout 4 whose migration has not yet emptied the layout 3 index keys (meta old-ix): an
-- entry may still be there, so claims read both and every removal clears both.
local OLD_IX = false

-- Exact integers in a Lua double: revisions, times, ttls and counts stay at or below it.
local MAX_INT = 9007199254740991

-- The longest ttl (2^47 ms, ~4,400 years): now + ttl stays exact.
local MAX_TTL = 140737488355328

local NOW = false

-- The server clock, read at most once per script (a call costs; many writes need no time)
-- and then the same for the whole script.
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end

local function push(list, ...)
  local n, values = #list, {...}
  for i = 1, #values do list[n + i] = values[i] end
end

local function opt_text(n)
  if n == false or n == nil then return '' end
  return int(n)
end

-- '' (none) or a decimal in [lo, hi]: false for none, nil for bad.
local function opt_decimal(s, lo, hi)
  if s == '' then return false end
  return decimal(s, lo, hi)
end

local function arg_text(i)
  local s = ARGV[i]
  if s == nil or s == '' or #s > MAX_TEXT then
    error('BADARG ARGV[' .. i .. '] must be non-empty text of at most ' .. MAX_TEXT .. ' bytes')
  end
  return s
end

-- Key -> its type ('none', 'zset', ...), asked at most once per script (of_type).
local TYPES = {}

-- Whether key is absent or of the given type ('zset', 'set', 'hash'). An error other than
-- a type (a key a cluster slot move took) aborts: nothing is written yet.
local function of_type(key, kind)
  local t = TYPES[key]
  if t == nil then
    local r = redis.pcall('TYPE', key)
    if type(r) == 'table' and r.err then error('ABORTED ' .. tostring(r.err)) end
    t = type(r) == 'table' and r.ok or r
    TYPES[key], READ[key] = t, true
  end
  return t == 'none' or t == kind
end

-- Index entries moved to the quarantine by this script (the reply's dropped).
local DROPPED = 0

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
  return {old = old, kind = kind, name = name, label = label, dir = base .. '/',
          pre = base .. '|', scored = kind == 'zset', unindex = kind == 'zset' and 'ZREM' or 'SREM'}
end

local LEASES_IX = index(LEASES, 'zset', 'leases', 'leases', P .. 'L')

local READY_IX = index(READY, 'zset', 'ready', 'ready', P .. 'Q')

local DEPS_IX = {}

-- The name every key of dep's waiters index starts with (layout 4): the length of dep in
-- it keeps every dependency's keys apart.
local function deps_base(dep)
  return P .. 'D' .. #dep .. ':' .. dep
end

-- Whether any run may wait for run to change (layout 4, no migration under way): its
-- waiters index has a first bucket or a directory.
local function waited_on(run)
  local base = deps_base(run)
  return redis.call('EXISTS', base .. '|', base .. '/') > 0
end

-- The index of the runs waiting for dep to change (scores all 0: ordered by run id).
local function deps_ix(dep)
  local ix = DEPS_IX[dep]
  if not ix then
    ix = index(P .. 'd:' .. dep, 'set', 'd', 'd:' .. dep, deps_base(dep))
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

-- A bucket of another type (a foreign write) leaves the directory: its range joins the
-- bucket before it, and it is listed in the quarantine as "bucket:<index>|<bound>".
local function drop_bucket(q, bound)
  q.dropped[bound], q.ndropped = true, q.ndropped + 1
  later('ZREM', q.ix.dir, bound)
  later('HSET', QUARANTINE, 'bucket:' .. q.ix.label .. '|' .. bound, 'type')
  DROPPED = DROPPED + 1
end

-- The bound of the bucket that holds (or would hold) composite c, skipping the buckets this
-- script dropped; nil when the first bucket is of another type, or more than 16 are (a
-- claim drops at most 8 of those it walks past).
local function bucket_of(q, c)
  local ix = q.ix
  while true do
    -- No directory (an index of one bucket, as every small one is): the first bucket.
    local got = {}
    if of_type(ix.dir, 'zset') and TYPES[ix.dir] ~= 'none' then
      got = redis.call('ZREVRANGEBYLEX', ix.dir, '[' .. c, '-', 'LIMIT', 0, q.ndropped + 1)
    end
    local b = ''
    for _, x in ipairs(got) do
      if not q.dropped[x] then
        b = x
        break
      end
    end
    if card_of(ix.pre .. b) then return b end
    if b == '' or q.ndropped >= 16 then return nil end
    drop_bucket(q, b)
  end
end

-- The bound of the bucket after the one of bound b, skipping buckets this script dropped
-- (and a foreign ''), or nil when b's is the last.
local function next_bound(q, b)
  local above = redis.call('ZRANGEBYLEX', q.ix.dir, '(' .. b, '+', 'LIMIT', 0, q.ndropped + 1)
  for _, x in ipairs(above) do
    if not q.dropped[x] and x ~= '' then return x end
  end
  return nil
end

-- Whether byte string a sorts before b, as the server compares members (Lua's own < follows
-- the server's locale). Ids differ early, so the loop is short.
local function bytes_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- A bucket bound as (score, run): (-1, '') for the first bucket's ''; nil for a bound a
-- foreign write made (then the server is asked every time).
local function bound_parts(b)
  if b == '' then return -1, '' end
  local digits = string.sub(b, 1, 16)
  if #digits < 16 or not string.find(digits, '^%d+$') then return nil end
  return tonumber(digits), string.sub(b, 17)
end

-- The bucket of (score, run) in a scored index: the last bucket found answers when (score,
-- run) lies between its bound and the next bound; else the server is asked (bucket_of).
-- The next bound is asked only when a second change comes (most scripts make one), and
-- then once per bucket: a batch (a claim, a renew) mostly lands in one or two buckets.
-- slot: which of q's two remembered buckets (removals and additions go to different ones).
local function bucket_at(q, score, run, slot)
  local ix, r = q.ix, q[slot]
  if r and (score > r.lo or (score == r.lo and not bytes_before(run, r.lr))) then
    if r.hi == nil then
      local above = next_bound(q, r.b)
      r.hi = false
      if above then r.hi, r.hr = bound_parts(above) end
      if above and not r.hi then r.hi, r.hr = -1, '' end  -- a foreign bound: always ask
    end
    if not r.hi or score < r.hi or (score == r.hi and bytes_before(run, r.hr)) then
      return r.b
    end
  end
  local b = bucket_of(q, composite(ix, score, run))
  if b == nil or not ix.scored then return b end
  local lo, lr = bound_parts(b)
  q[slot] = lo and {b = b, lo = lo, lr = lr} or nil
  return b
end

-- Where each queued change goes: per bucket the runs to remove and the (score, run) pairs
-- to add, found with reads only (commit calls it before its first write). Returns the
-- CORRUPT field of a damaged index, or nil and the count of changes.
local function ix_plan()
  local n = 0
  for _, q in ipairs(IXS) do
    local ix = q.ix
    q.rems, q.adds, q.rorder, q.aorder = {}, {}, {}, {}
    if #q.runs > 0 and not of_type(ix.dir, 'zset') then return 'index:' .. ix.name end
    for _, run in ipairs(q.runs) do
      local old, new = q.rem[run], q.add[run]
      if old and old ~= new then
        local b = q.at[run]
        if b == nil then b = bucket_at(q, old, run, 'from') end
        if b == nil then return 'index:' .. ix.name end
        if not q.rems[b] then
          q.rems[b] = {}
          q.rorder[#q.rorder + 1] = b
        end
        push(q.rems[b], run)
        n = n + 1
      end
      if new then
        local b = bucket_at(q, new, run, 'to')
        if b == nil then return 'index:' .. ix.name end
        if not q.adds[b] then
          q.adds[b] = {}
          q.aorder[#q.aorder + 1] = b
        end
        push(q.adds[b], int(new), run)
        n = n + 1
      end
    end
  end
  return nil, n
end

-- Split the bucket of bound b when it holds more than BUCKET_MAX entries: the first
-- BUCKET_HALF stay, the rest go to new buckets of BUCKET_HALF (the last takes what is left).
-- Each is written afresh: Redis never turns a sorted set that outgrew a listpack back into
-- one. A new bucket's name already in use (a foreign key) or an entry of a foreign score
-- leaves the bucket whole: it costs memory, and one entry read per addition (the first new
-- bucket's name is checked before the bucket is read). So does a bucket grown past what one
-- script adds (BUCKET_MAX + 2048) by foreign writes: splitting it would stall the server.
local function split(ix, b, n)
  local key = ix.pre .. b
  if n <= BUCKET_MAX or n > BUCKET_MAX + 2048 then return end
  local first = redis.call('ZRANGE', key, BUCKET_HALF, BUCKET_HALF, 'WITHSCORES')
  local at = decimal(first[2], 0, MAX_INT)
  if not at or redis.pcall('EXISTS', ix.pre .. composite(ix, at, first[1])) ~= 0 then return end
  local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local parts = math.floor(n / BUCKET_HALF)
  local starts = {{1, b}}
  for p = 2, parts do
    local i = (p - 1) * 2 * BUCKET_HALF + 1
    local score = decimal(all[i + 1], 0, MAX_INT)
    if not score then return end
    local bound = composite(ix, score, all[i])
    if redis.pcall('EXISTS', ix.pre .. bound) ~= 0 then return end
    starts[p] = {i, bound}
  end
  redis.call('DEL', key)
  for p = 1, parts do
    local from, last = starts[p][1], #all
    if starts[p + 1] then last = starts[p + 1][1] - 1 end
    local args = {'ZADD', ix.pre .. starts[p][2]}
    for i = from, last, 2 do push(args, all[i + 1], all[i]) end
    redis.call(unpack(args))
    CARDS[ix.pre .. starts[p][2]] = (last - from + 1) / 2
    if p > 1 then redis.call('ZADD', ix.dir, 0, starts[p][2]) end
  end
end

-- Send what ix_plan placed: removals first (a bucket they empty leaves the directory, unless
-- this script adds to it), then additions, splitting a bucket they fill.
local function ix_apply()
  for _, q in ipairs(IXS) do
    local ix = q.ix
    for _, b in ipairs(q.rorder) do
      local key = ix.pre .. b
      local runs, n = q.rems[b], card_of(key)
      for i = 1, #runs, 1000 do
        n = n - redis.call('ZREM', key, unpack(runs, i, math.min(i + 999, #runs)))
      end
      CARDS[key] = n
      if b ~= '' and not q.adds[b] and n <= 0 then redis.call('ZREM', ix.dir, b) end
    end
    for _, b in ipairs(q.aorder) do
      local key = ix.pre .. b
      local args, n = q.adds[b], card_of(key)
      for i = 1, #args, 1000 do
        n = n + redis.call('ZADD', key, unpack(args, i, math.min(i + 999, #args)))
      end
      CARDS[key] = n
      split(ix, b, n)
    end
  end
end

-- The bounds of the buckets of ix in order, read in pages of 16 ('' first; a foreign ''
-- in the directory is passed over): an iterator.
local function buckets(ix)
  local page, i, offset, full = {''}, 0, 0, true
  return function()
    while true do
      i = i + 1
      if page[i] == nil then
        if not full then return nil end
        page = redis.call('ZRANGEBYLEX', ix.dir, '-', '+', 'LIMIT', offset, 16)
        offset, full, i = offset + #page, #page == 16, 1
        if page[1] == nil then return nil end
      end
      if page[i] ~= '' or offset == 0 then return page[i] end
    end
  end
end

-- The first entry of index ix (run, score), or nil. Reads at most 8 buckets (empty ones are
-- left by foreign writes only) and, while migrating, the old key.
local function ix_head(ix)
  local run, score
  if (NS < 4 or OLD_IX) and of_type(ix.old, 'zset') then
    local h = redis.call('ZRANGE', ix.old, 0, 0, 'WITHSCORES')
    run, score = h[1], tonumber(h[2])
  end
  if NS >= 4 and of_type(ix.dir, 'zset') then
    local seen = 0
    for b in buckets(ix) do
      local n = card_of(ix.pre .. b)
      if n and n > 0 then
        local h = redis.call('ZRANGE', ix.pre .. b, 0, 0, 'WITHSCORES')
        if h[1] and (not score or tonumber(h[2]) < score) then
          run, score = h[1], tonumber(h[2])
        end
        break
      end
      seen = seen + 1
      if seen >= 8 then break end
    end
  end
  return run, score
end

-- Whether index ix's keys are of the right types, as far as a script checks before it reads
-- them (absent keys are): the old key below layout 4 and while migrating; the directory and
-- the first bucket from layout 4 (a later bucket of another type is dropped when met).
local function index_intact(ix)
  if (NS < 4 or OLD_IX) and not of_type(ix.old, ix.scored and 'zset' or 'set') then
    return false
  end
  return NS < 4 or (of_type(ix.dir, 'zset') and card_of(ix.pre) ~= false)
end

-- The wake token of a run: its id, or "#" and its SHA1 when the id is long (a token is
-- copied into every signal and pop).
local function wake_token(run)
  if #run <= 64 then return run end
  return '#' .. redis.sha1hex(run)
end

-- Wake-up signals, sent after the script's writes (see send_signals): per wake key, the
-- tokens to add and the tokens to remove.
local SIGNALS = {}

local UNSIGNALS = {}

-- Per index (by its dir), its earliest score before this script's writes, lowered by each
-- signal of an earlier time (false: empty); read at most once.
local HEADS = {}

local function queue_token(queue, key, run)
  local list = queue[key]
  if not list then
    list = {}
    queue[key] = list
  end
  list[#list + 1] = wake_token(run)
end

-- run entered index, claimable from backend time t: wake one blocked claimer when it is
-- claimable now, or due soon and earlier than everything the index held (claimers' timers
-- were set for a later head) or behind a head that is due now. One due WAKE_AHEAD ms or more ahead needs no signal: every
-- blocked claim claims again within its re-arm period (shorter) and learns of it then.
local function signal(key, index, run, t)
  local now = now_ms()
  if t > now then
    if t - now >= WAKE_AHEAD then return end
    local head = HEADS[index.dir]
    if head == nil then
      local _, h = ix_head(index)
      head = h or false
    end
    -- A head due later than now has a timer on some node (the claim that saw it set one);
    -- a head due now has none (no claim is blocked, or one is about to take it): signal.
    if head and head <= t and head > now then
      HEADS[index.dir] = head
      return
    end
    if not head or t < head then HEADS[index.dir] = t end
  end
  queue_token(SIGNALS, key, run)
end

-- A claim took run: its token, if any, has done its work.
local function unsignal(key, run)
  queue_token(UNSIGNALS, key, run)
end

-- Send the queued signals. They are advice: each command is a pcall, so a wake key of
-- another type (a foreign write), a full one (MAX_WAKE tokens) or a refused write (OOM)
-- only skips the signal; the data the script wrote stands, and blocked claimers find the
-- work at their re-arm.
-- Add tokens to wake key key, as advice (pcalls), up to MAX_WAKE in all.
local function add_tokens(key, tokens)
  local n = redis.pcall('ZCARD', key)
  if type(n) ~= 'number' or n >= MAX_WAKE then return end
  local args = {'ZADD', key, 'NX'}
  local at = int(now_ms())
  for i = 1, math.min(#tokens, MAX_WAKE - n) do push(args, at, tokens[i]) end
  redis.pcall(unpack(args))
  -- A partition also says "look" on its sharded channel (named as the key, so in its slot):
  -- a cluster's waker per node listens to its partitions' channels, where one BZPOPMIN
  -- cannot span slots. A server without sharded channels (Redis 6.2) or a user without
  -- the channel only loses the message: the token stays, for the waker per partition.
  if PARTITION then redis.pcall('SPUBLISH', key, '1') end
end

local function send_signals()
  for _, key in ipairs({WAKE_READY, WAKE_LEASES}) do
    local gone = UNSIGNALS[key]
    if gone then redis.pcall('ZREM', key, unpack(gone)) end
    if SIGNALS[key] then add_tokens(key, SIGNALS[key]) end
  end
end

-- The type each write command needs of its key.
local WRITE_TYPES = {ZADD = 'zset', ZREM = 'zset', SADD = 'set', SREM = 'set', HSET = 'hash',
  HDEL = 'hash', SETRANGE = 'string'}

-- The field a commit answers CORRUPT with when a key its writes name is of another type:
-- each index key is asked once, and only when the script writes it. Run keys and META were
-- read (and checked) before anything was queued.
local function writes_ok()
  local runs = P .. 'r:'
  for i = 1, #WRITES do
    local command, k = WRITES[i][1], WRITES[i][2]
    local kind = WRITE_TYPES[command]
    local head = string.sub(k, 1, #runs)
    if kind and k ~= META and head ~= runs and not of_type(k, kind) then
      if head == P .. 'd:' or string.sub(k, 1, #P + 1) == P .. 'D' then return 'index:d' end
      local names = {[LEASES] = 'index:leases', [READY] = 'index:ready',
        [LEASES_IX.dir] = 'index:leases', [READY_IX.dir] = 'index:ready',
        [FANOUT] = 'index:fanout', [FANOUT_CURSOR] = 'index:fanout-cursor',
        [QUARANTINE] = 'quarantine'}
      return names[k] or 'type'
    end
  end
  return nil
end

-- Commands that take many members (or fields) in one call.
local VARIADIC = {ZADD = true, ZREM = true, SADD = true, SREM = true, HSET = true, HDEL = true}

-- WRITES with each write of a variadic command joined to the key's previous write when that
-- is the same command: one call where a claim of 100 runs queued 100 ZADDs (a call costs
-- the server 1-5 us). Each key still sees its writes in the order queued (only writes to
-- other keys are passed over); at most 1,000 arguments a call.
local function coalesced()
  local out, last = {}, {}
  for i = 1, #WRITES do
    local w = WRITES[i]
    local j = last[w[2]]
    local o = j and out[j]
    if o and VARIADIC[w[1]] and o[1] == w[1] and #o + #w <= 1002 then
      for a = 3, #w do o[#o + 1] = w[a] end
    else
      out[#out + 1] = w
      last[w[2]] = #out
    end
  end
  return out
end

-- Send the queued writes as they are: a fast path's, whose keys it read (their types are
-- known) and whose first write grows memory (an OOM refuses it before anything is written).
local function flush()
  for i = 1, #WRITES do redis.call(unpack(WRITES[i])) end
end

-- Send the queued writes, or answer the field of a key of the wrong type (nothing sent).
-- The caller returns {CORRUPT, field} for the latter.
local function commit()
  local bad, changes = ix_plan()
  if bad then return bad end
  if #WRITES == 0 and changes == 0 then return nil end
  bad = writes_ok()
  if bad then return bad end
  -- Under maxmemory Redis refuses a script's first write (OOM) only if that write is one
  -- that can grow memory (HDEL, ZREM... are not), and lets every later write through. So
  -- the first write is always such a one: it records the namespace's layout, which changes
  -- nothing but a missing meta key. check_layout ran first (NS is the namespace's).
  touch_writes()
  redis.call('HSETNX', META, 'layout', int(NS))
  local batched = coalesced()
  for i = 1, #batched do redis.call(unpack(batched[i])) end
  ix_apply()
  send_signals()
  return nil
end

-- read_layout: refuse a namespace laid out by a newer library; a damaged meta key is corrupt. In a
-- partition, compare the count the caller was opened with (ARGV[1] after P) with the one the
-- partition records (meta partitions): another is PARTITIONED (0 while a repartition is
-- under way, 1 once the namespace went back to one partition); none, for a caller that has
-- not checked the namespace's own count, is UNCOUNTED (it checks, then calls again), and
-- for one that has ('6+') a write records it (queued: a script that writes nothing records
-- nothing). Each field is bounded before it is read whole.
local function read_layout()
  local size = redis.pcall('HSTRLEN', META, 'layout')
  if type(size) == 'table' then
    wrong_type(size)  -- not a type error (a key the ACL denies...): raised, not corrupt
    return {CORRUPT, 'meta', 0, -1}
  end
  if size > 16 then return {CORRUPT, 'meta.layout', 0, -1} end
  if redis.call('HSTRLEN', META, 'old-ix') > 16 then return {CORRUPT, 'meta.old-ix', 0, -1} end
  if redis.call('HSTRLEN', META, 'partitions') > 16 then
    return {CORRUPT, 'meta.partitions', 0, -1}
  end
  local got = redis.call('HMGET', META, 'layout', 'old-ix', 'partitions')
  local count = string.sub(ARGV[1], #META - 3)  -- what follows P
  if PARTITION then
    if count ~= '*' and count ~= '' then
      local want, record = string.match(count, '^([1-9]%d?%d?)(%+?)$')
      if not want then error("BADARG ARGV[1] must end with the store's partition count") end
      if got[3] then
        if got[3] ~= want then
          local n = decimal(got[3], 0, MAX_PARTITIONS)
          if n == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
          return {PARTITIONED, n, 0, -1}
        end
      elseif record == '' then
        return {UNCOUNTED, 0, 0, -1}
      else
        later('HSETNX', META, 'partitions', want)
      end
    end
  elseif count ~= '' then
    error('BADARG ARGV[1] must be a key prefix {namespace}:')
  elseif got[3] then
    -- The namespace is spread over partitions, whose keys are {ns#p}: this store of one
    -- (prefix {ns}:) must not write beside them. A count is never 1 (one partition
    -- records none).
    local n = decimal(got[3], 2, MAX_PARTITIONS)
    if n == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
    return {PARTITIONED, n, 0, -1}
  end
  if not got[1] then return nil end
  local n = decimal(got[1], 1, 1000000)
  if n == nil then return {CORRUPT, 'meta.layout', 0, -1} end
  if n > LAYOUT then return {TOO_NEW, n, 0, -1} end
  if got[2] and got[2] ~= '1' then return {CORRUPT, 'meta.old-ix', 0, -1} end
  NS, OLD_IX = n, n >= 4 and got[2] == '1'
  return nil
end

-- The layout check's answer, once per script (a fast path's, the slow path's again).
local LAYOUT_CHECKED = false

local function check_layout()
  if not LAYOUT_CHECKED then LAYOUT_CHECKED = {read_layout()} end
  return LAYOUT_CHECKED[1]
end

local function run_key(run)
  return P .. 'r:' .. run
end

local FIELDS = {'rev', 'own', 'exp', 'ck', 'cdr', 'cat', 'wk', 'wa', 'wn', 'wdl', 'wrev',
                'wpv', 'pk', 'pt', 'tk', 'px', 'rt'}

-- Layout 2 stores these fields as length-prefixed text ("6:node-a"), the others as decimals.
local TEXT = {own = true, ck = true, wa = true, pk = true}

-- Layout 2's header: FIELDS in order, each ended by ',' ('' for absent; absent fields at
-- the end are left out), then room (spaces) left by a header that shrank. decode gives the
-- fields as text (absent: nil), or nil and the field that is malformed.
local function decode(h)
  local raw, pos, n = {}, 1, #h
  for i = 1, #FIELDS do
    local name, c = FIELDS[i], string.byte(h, pos)
    if c == nil or c == 32 then break end
    if TEXT[name] and c ~= 44 then
      local digits = string.match(h, '^(%d+):', pos)
      local len = decimal(digits, 0, n)
      if not len then return nil, name end
      local from = pos + #digits + 1
      raw[name] = string.sub(h, from, from + len - 1)
      pos = from + len
      if #raw[name] ~= len or string.byte(h, pos) ~= 44 then return nil, name end
    else
      local e = string.find(h, ',', pos, true)
      if not e then return nil, name end
      if e > pos then raw[name] = string.sub(h, pos, e - 1) end
      pos = e
    end
    pos = pos + 1
  end
  if pos <= n and not string.find(h, '^ *$', pos) then return nil, 'header' end
  return raw
end

local function text_field(x)
  if x then return #x .. ':' .. x end
  return ''
end

local function number_field(n)
  if n then return int(n) end
  return ''
end

-- The layout 2 header of state s (see decode). Built in one table, without push (a call
-- per field costs more than the rest of the header).
local function header(s)
  local ck, cdr, cat = '', '', ''
  if s.cat then ck, cdr, cat = text_field(s.ck or ''), number_field(s.cdr), int(s.cat) end
  local wk, wa, wn, wdl, wrev, wpv, pk, pt = '', '', '', '', '', '', '', ''
  if s.wk then
    wk, wn, wdl, wrev, wpv = s.wk, number_field(s.wn), number_field(s.wdl), int(s.wrev),
      int(s.wpv)
    wa, pk, pt = text_field(s.wk ~= 'a' and s.wa), text_field(s.pk),
      number_field(s.pk and s.pt)
  end
  local f = {int(s.rev), text_field(s.own), number_field(s.own and s.exp), ck, cdr, cat, wk,
             wa, wn, wdl, wrev, wpv, pk, pt, number_field(s.tk > 0 and s.tk),
             number_field(s.px and 1), number_field(NS >= 4 and s.rt)}
  -- Absent fields at the end are left out (a text field's own bytes may end in ',').
  local n = #f
  while n > 1 and f[n] == '' do n = n - 1 end
  return table.concat(f, ',', 1, n) .. ','
end

-- The header region's trailer: its length in decimal, then the count of those digits.
local function trailer(size)
  local digits = int(size)
  return digits .. #digits
end

-- The longest header region a run may have (6 digits in the trailer).
local MAX_HEADER = 999999

-- Bytes read from the end of a layout 2 value at first: most headers fit.
local TAIL = 192

-- The raw fields of a layout 2 run (a string: record, header region, trailer), with the
-- record's length and the region's; nil when the key is absent; false and a reason when
-- the value is malformed.
local function stored_v2(k, tail)
  if tail == '' then
    if redis.call('EXISTS', k) == 1 then return false, 'header' end
    return nil
  end
  local d = tonumber(string.sub(tail, -1))
  local size = d and d >= 1 and d <= 6 and decimal(string.sub(tail, -1 - d, -2), 1, MAX_HEADER)
  if not size then return false, 'header' end
  local total = #tail
  if total == TAIL then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  if len < 0 then return false, 'header' end
  local h
  if size + d + 1 <= #tail then
    h = string.sub(tail, -size - d - 1, -d - 2)
  else
    h = redis.call('GETRANGE', k, len, len + size - 1)
  end
  local raw, bad = decode(h)
  if not raw then return false, bad end
  raw.v, raw.len, raw.region = 2, len, size
  return raw
end

-- The raw fields of a layout 1 run (a hash), as stored_v2.
local function stored_v1(k)
  local v = redis.pcall('HMGET', k, unpack(FIELDS))
  if v.err then return false, wrong_type(v) end
  if not v[1] then
    if redis.call('EXISTS', k) == 1 then return false, 'rev' end
    return nil
  end
  -- A run moved to layout 2 by a write is rewritten whole: its record must be there.
  if NS >= 2 and redis.call('HEXISTS', k, 'rec') == 0 then return false, 'rec' end
  local raw = {v = 1}
  for i = 1, #FIELDS do raw[FIELDS[i]] = v[i] or nil end
  return raw
end

local function stored(k)
  READ[k] = true
  if NS == 1 then return stored_v1(k) end
  local tail = redis.pcall('GETRANGE', k, -TAIL, -1)
  if type(tail) == 'table' then
    wrong_type(tail)
    return stored_v1(k)
  end
  return stored_v2(k, tail)
end

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
  later('RENAME', key, P .. 'damaged:' .. name .. ':' .. int(now_ms()))
  later('HSET', QUARANTINE, 'damaged|' .. name, reason)
  TYPES[key] = 'none'
end

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
  return 2 * (deleted_rev() or 0) + 1
end

-- The partitions watching run here: its watch key is a hash partition -> watch number (of
-- at most MAX_PARTITIONS fields, a few bytes each; "*": every partition, left where a
-- damaged key was); nil when the key is of another type, over its bounds or holds a field
-- that is not ours (damaged: see announce).
local function watchers(run)
  local key = P .. 'watch:' .. run
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
  set_aside('watch:' .. run, 'damaged')
  later('HSET', P .. 'watch:' .. run, '*', '0')
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
-- this script takes out of dep's waiters (nil: none). Exact for an index of one bucket;
-- one of more (over BUCKET_MAX waiters once) counts as waited on until it shrinks back.
local function idle(dep, leaving)
  local ix = deps_ix(dep)
  if NS < 4 or OLD_IX then
    if not of_type(ix.old, 'set') then return false end
    local n = redis.call('SCARD', ix.old)
    if n > 1 or (n == 1 and not (leaving and redis.call('SISMEMBER', ix.old, leaving) == 1)) then
      return false
    end
  end
  if NS >= 4 then
    if not of_type(ix.dir, 'zset') or TYPES[ix.dir] ~= 'none' then return false end
    local n = card_of(ix.pre)
    if n == false or n > 1 then return false end
    if n == 1 and not (leaving and redis.call('ZSCORE', ix.pre, leaving)) then return false end
  end
  return true
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

-- The run at revision expected, or nil and the reply that refuses the call.
local function load_at(run, expected)
  local s, bad = load(run)
  if s == nil then return nil, {NOT_FOUND, false, 0, -1} end
  if s == false then return nil, {CORRUPT, bad, 0, -1} end
  if s.rev ~= expected then return nil, {CONFLICT, s.rev, 0, -1} end
  return s
end

-- The due entries of ix (score <= now) in order, with their run's state, visiting at most
-- limit + MAX_VISIT of them (an empty or dropped bucket counts as one) and stopping once
-- out holds limit runs. An entry whose run is missing, of another type or corrupt is
-- quarantined on the way; a bucket of another type is dropped (drop_bucket). Entries are
-- read in pages, the first just a little longer than limit: a claim of one run over a large
-- index copies a few entries into the script, not limit + MAX_VISIT. The offsets hold
-- because every write waits for commit. While migrating to layout 4 the old key's entries
-- are merged in.
local function due(ix, limit, out)
  local cap, visits, now = limit + MAX_VISIT, 0, now_ms()
  local function want() return math.min(math.max(2 * (limit - #out), 8), cap - visits) end
  local q = NS >= 4 and ix_queue(ix)
  local old
  if NS < 4 or OLD_IX then
    local page, i, read, full = {}, 1, 0, true
    old = function()
      if page[i] == nil then
        local n = want()
        if not full or n <= 0 then return nil end
        page = redis.call('ZRANGEBYSCORE', ix.old, '-inf', int(now), 'WITHSCORES', 'LIMIT',
          read, n)
        read, full, i = read + n, #page == 2 * n, 1
      end
      i = i + 2
      return page[i - 2], tonumber(page[i - 1])
    end
  end
  local new
  if NS >= 4 then
    local bounds, key, bound, page, i, offset, more = buckets(ix), nil, nil, {}, 1, 0, false
    new = function()
      while true do
        if page[i] then
          local run, score = page[i], tonumber(page[i + 1])
          i = i + 2
          if score > now then return nil end  -- buckets are in order: nothing later is due
          return run, score, bound
        end
        local n = want()
        if n <= 0 then return nil end
        if not more then
          bound = bounds()
          if bound == nil then return nil end
          key, offset = ix.pre .. bound, 0
          if q.dropped[bound] then
            more = false
          elseif not card_of(key) then
            if q.ndropped < 8 then drop_bucket(q, bound) end
            more = false
          else
            more = true
          end
          if not more then visits = visits + 1 end
        end
        if more then
          page = redis.call('ZRANGE', key, offset, offset + n - 1, 'WITHSCORES')
          -- An empty bucket (left by a foreign write) counts as a visit: never a wall.
          if offset == 0 and page[1] == nil then visits = visits + 1 end
          i, offset, more = 1, offset + n, #page == 2 * n
        end
      end
    end
  end
  local seen, ar, as, br, bs, bb = {}, nil, nil, nil, nil, nil
  return function()
    while #out < limit and visits < cap do
      if old and not ar then
        ar, as = old()
        if not ar then old = nil end
      end
      if new and not br then
        br, bs, bb = new()
        if not br then new = nil end
      end
      local run, score, bound
      if ar and (not br or as < bs or (as == bs and bytes_before(ar, br))) then
        run, score, ar = ar, as, nil
      elseif br then
        run, score, bound, br = br, bs, bb, nil
      else
        return nil
      end
      visits = visits + 1
      if not seen[run] then
        seen[run] = true
        if q then
          q.found[run] = bound ~= nil and score
          q.at[run] = bound
        end
        local s, bad = load(run)
        if s then return run, s end
        if s == nil then bad = 'missing' end
        quarantine(ix, run, bad)
      end
    end
    return nil
  end
end

-- Lease holder as the reply shape {owner|false, live 0|1}. Expiry == now is expired.
local function holder(s)
  if not s.own then return {false, 0} end
  if s.exp > now_ms() then return {s.own, 1} end
  return {s.own, 0}
end

-- A run as read: the reply shape of run_get and of each run a claim with records hands
-- back: {revision, record, owner|false, live 0|1, claim_key|false, claim_dep_rev|'',
-- claimed_at|false}.
local function current(s, rec)
  local h = holder(s)
  return {s.rev, rec, h[1], h[2], s.ck or false, opt_text(s.cdr), s.cat or false, s.tk}
end

-- Record bytes handed back so far by this claim.
local SPENT = 0

-- A claim with records (budget > 0 bytes, at most MAX_CLAIM_BYTES) hands back each claimed
-- run's record: the record of run, or nil when it would take the claim past budget after
-- taken runs (the claim stops before it: the first run always goes), or false when the
-- record is missing (a damaged layout 1 run), quarantined from index ix.
-- The size is checked before the record is read: a record that does not fit costs nothing.
local function claimed_record(run, s, budget, taken, ix)
  local size = s.len
  if s.v == 1 then
    size = nil
    if redis.call('HEXISTS', run_key(run), 'rec') == 1 then
      size = redis.call('HSTRLEN', run_key(run), 'rec')
    end
  end
  if size == nil then
    quarantine(ix, run, 'rec')
    return false
  end
  if taken > 0 and SPENT + size > budget then return nil end
  SPENT = SPENT + size
  return record_of(run, s)
end

-- READY may hold a run only while it is free and has a wait.
local function indexable(s)
  return (not s.own) and s.wk
end

-- Backend time from which the run in state s is eligible for claim_ready, or nil when it is
-- not (held, no wait, stale metadata, or waiting for a dependency to change). Immediate
-- triggers (an unseen or changed dependency, a poll key seen for the first time) count
-- from now.
local function eligible_at(s, pv)
  if s.own or not s.wk or s.wrev ~= s.rev or s.wpv < pv then
    return nil
  end
  local t = nil
  if s.wk == 'a' then
    t = s.wn
  elseif s.wk == 'p' then
    if s.pt then t = s.pt + s.wn else t = now_ms() end
  else
    if s.wn == false or dep_revision(s.wa) ~= s.wn then t = now_ms() end
  end
  if s.wdl and (t == nil or s.wdl < t) then t = s.wdl end
  return t
end

-- After a claim's writes: how long until index has a claimable entry, in ms (0: one is due
-- now, or pending is true: work is left; -1: nothing), and, when work is left and the
-- claim took some, one token added so that another blocked claimer takes the rest (as
-- advice, like every signal).
local function wait_after_claim(key, ix, took, pending)
  local now = now_ms()
  local run, t = ix_head(ix)
  local wait = -1
  if pending or (t and t <= now) then
    wait = 0
  elseif t and t <= MAX_INT then
    wait = math.ceil(t) - now
  end
  if wait == 0 and took > 0 and run then add_tokens(key, {wake_token(run)}) end
  return wait
end

-- READY scores as planned by this script (false: removed).
local PLACED = {}

-- Put run where it belongs in READY after a write of its own (its time is recomputed) or of
-- its dependency (dep_write: a run already eligible keeps its earlier time, so runs are
-- ordered by when their wait became due). was_indexable false: the run was held or had no
-- wait before this write, so READY holds no entry of it to remove (a stray one, written by
-- hand, is dropped by the next claim_ready that meets it). From layout 4 the run's state
-- keeps its score (rt), which finds its entry: the caller saves s after.
local function place(run, s, pv, dep_write, was_indexable)
  local t = eligible_at(s, pv)
  if t and t > MAX_INT then t = MAX_INT end  -- a poll time past MAX_INT: stored, and read back
  if t == nil then
    if was_indexable ~= false or s.rx then ix_rem(READY_IX, run, s.rx) end
    PLACED[run], s.rt = false, false
    return
  end
  if dep_write and t == now_ms() then
    local old = PLACED[run]
    if old == nil and s.rt then
      old = s.rt
    elseif old == nil and (NS < 4 or OLD_IX) and of_type(READY, 'zset') then
      old = tonumber(redis.call('ZSCORE', READY, run))
    end
    if old and old <= t then
      -- Kept where it is; from layout 4 put there again, in case its entry was lost.
      if NS >= 4 and PLACED[run] == nil and s.rt then ix_add(READY_IX, run, old, s.rx) end
      return
    end
  end
  ix_add(READY_IX, run, t, s.rx)
  PLACED[run], s.rt = t, t
  signal(WAKE_READY, READY_IX, run, t)
end

-- Claim info belongs to the owner whose ready claim made it: it goes with the lease.
local function drop_claim(s)
  s.ck, s.cdr, s.cat = false, false, false
end

-- Index run's lease, expiring at exp.
local function index_lease(run, s, exp)
  ix_add(LEASES_IX, run, exp, s.lx)
  signal(WAKE_LEASES, LEASES_IX, run, exp)
end

-- Hand run's lease to owner until exp (the caller saves s).
local function hold(run, s, owner, exp)
  if s.own ~= owner then drop_claim(s) end
  s.own, s.exp = owner, exp
  index_lease(run, s, exp)
end

-- The lease condition's effect on s: 'c'/'s' hand it to owner for ttl, 'r' frees it,
-- 'h' leaves it.
local function apply_lease(run, s, kind, owner, ttl)
  if kind == 'c' or kind == 's' then
    hold(run, s, owner, now_ms() + ttl)
  elseif kind == 'r' and s.own then
    drop_claim(s)
    s.own, s.exp = false, false
    ix_rem(LEASES_IX, run, s.lx)
  end
end

-- The wait arguments at ARGV[A..A+3] and the projection version at ARGV[A+4], checked:
-- {wk, wa, wn, wdl} with numbers as numbers (wk '' for none), and pv.
local function arg_wait(A)
  local wk, wa = ARGV[A], ARGV[A + 1]
  local w = {wk = wk, wa = wa, wn = false, wdl = false}
  if wk == 'c' then
    arg_text(A + 1)
    w.wn = opt_decimal(ARGV[A + 2], 0, MAX_INT)
  elseif wk == 'p' then
    arg_text(A + 1)
    w.wn = decimal(ARGV[A + 2], 1, MAX_INT)
  elseif wk == 'a' then
    w.wn = decimal(ARGV[A + 2], 0, MAX_INT)
  elseif wk ~= '' then
    error('BADARG ARGV[' .. A .. '] must be a wait kind: c, p, a or empty')
  end
  if wk ~= '' then
    if w.wn == nil then error('BADARG ARGV[' .. (A + 2) .. '] is not a valid number') end
    w.wdl = opt_decimal(ARGV[A + 3], 0, MAX_INT)
    if w.wdl == nil then error('BADARG ARGV[' .. (A + 3) .. '] is not a valid deadline') end
  end
  -- ARGV[A + 5..A + 7]: for a dependency in another partition, the version its watch read,
  -- that watch's number and the dependency's partition (the last two absent: unnumbered).
  w.watched = opt_decimal(ARGV[A + 5] or '', 0, MAX_INT)
  if w.watched == nil or (w.watched and (wk ~= 'c' or not PARTITION)) then
    error('BADARG ARGV[' .. (A + 5) .. '] must be empty or, for a dependency of a partition, '
      .. 'its watched version')
  end
  -- ARGV[A + 8]: '1' when the store watched again after a REWATCH (see rewatch).
  w.again = arg_flag(A + 8) == 1
  w.ws = opt_decimal(ARGV[A + 6] or '', 1, MAX_INT)
  w.wd = opt_decimal(ARGV[A + 7] or '', 0, MAX_PARTITIONS - 1)
  if w.ws == nil or w.wd == nil or (w.ws and not w.watched) or ((w.ws == false) ~= (w.wd == false)) then
    error('BADARG ARGV[' .. (A + 6) .. '..' .. (A + 7) .. '] must be empty or a watch number '
      .. 'and the partition of the watched dependency')
  end
  return w, arg_int(A + 4, 0, 2147483648)
end

-- The lease arguments at ARGV[A..A+2]: kind, owner, ttl.
local function arg_lease(A)
  local kind = ARGV[A]
  if kind == 'c' or kind == 's' then
    return kind, arg_text(A + 1), arg_int(A + 2, 1, MAX_TTL)
  elseif kind == 'h' then
    return kind, arg_text(A + 1), 0
  elseif kind == 'r' then
    return kind, '', 0
  end
  error('BADARG ARGV[' .. A .. '] must be a lease kind: h, c, s or r')
end

-- A waiter w met by a fan-out over ix: placed in READY (from layout 4 its state is saved
-- when its ready score changes), or dropped from ix when missing, quarantined when corrupt.
local function fan_out_one(ix, w, pv)
  local ws, bad = load(w)
  if ws then
    if indexable(ws) then
      local rt = ws.rt
      place(w, ws, pv, true)
      if NS >= 4 and ws.rt ~= rt then save(w, ws) end
    end
  elseif ws == nil then
    ix_rem(ix, w, 0)
  else
    quarantine(ix, w, bad)
  end
end

-- Re-index up to cap (MAX_FANOUT when nil) waiters of dep from cursor; returns the next
-- cursor ('0' when every waiter was visited). Below layout 4 (and while migrating, first) the cursor is the
-- old set's SSCAN cursor; from layout 4 it is "b" and the last waiter visited: buckets are
-- walked in order, each bucket visited counting as a waiter.
local function fan_out(dep, cursor, pv, cap)
  cap = cap or MAX_FANOUT
  local ix = deps_ix(dep)
  local visited = 0
  if string.find(cursor, '^%d+$') and (NS < 4 or OLD_IX) then
    if of_type(ix.old, 'set') then
      repeat
        local page = redis.call('SSCAN', ix.old, cursor, 'COUNT', math.min(100, cap))
        cursor = page[1]
        for _, w in ipairs(page[2]) do
          fan_out_one(ix, w, pv)
          visited = visited + 1
        end
      until cursor == '0' or visited >= cap
    else
      cursor = '0'
    end
    if NS < 4 or cursor ~= '0' then return cursor end
  end
  if NS < 4 then return '0' end
  local after = ''
  if string.sub(cursor, 1, 1) == 'b' then after = string.sub(cursor, 2) end
  if not of_type(ix.dir, 'zset') then return '0' end
  local q = ix_queue(ix)
  local b, walked = '', false
  if after ~= '' then b = bucket_of(q, after) end
  while b and visited < cap do
    visited = visited + 1
    local n = card_of(ix.pre .. b)
    if n and n > 0 then
      local from = '-'
      if after ~= '' then from = '(' .. after end
      local page = redis.call('ZRANGEBYLEX', ix.pre .. b, from, '+', 'LIMIT', 0,
        cap - visited + 1)
      for _, w in ipairs(page) do
        fan_out_one(ix, w, pv)
        visited, after = visited + 1, w
      end
      if visited >= cap then return 'b' .. after end
    else
      -- An empty bucket (a foreign directory entry) or one of another type (dropped): the
      -- cursor moves past its bound, so no later step walks it again.
      if n == false and q.ndropped < 8 then drop_bucket(q, b) end
      if walked then after = b end
    end
    walked = true
    b = next_bound(q, b)
  end
  if b then return 'b' .. after end
  return '0'
end

-- run was written: each run waiting for it to change may now be eligible. Up to
-- MAX_FANOUT waiters are re-indexed here; a dependency with more is queued in FANOUT and
-- finished by the next claim_ready calls (a waiter is never missed, only delayed).
local function notify_dependents(run, pv)
  local ix = deps_ix(run)
  local has = (NS < 4 or OLD_IX) and of_type(ix.old, 'set') and TYPES[ix.old] ~= 'none'
  if NS >= 4 and not has then has = redis.call('EXISTS', ix.pre, ix.dir) > 0 end
  if not has then return end
  local cursor = fan_out(run, '0', pv)
  if cursor ~= '0' then
    later('ZADD', FANOUT, int(now_ms()), run)
    later('HSET', FANOUT_CURSOR, run, cursor)
    -- The rest are re-indexed by claim_ready calls: wake one, whatever the first page held.
    queue_token(SIGNALS, WAKE_READY, run)
  end
end

-- The fields of the discovered wait w, derived from s.rev at version pv, set in s. A poll
-- key's saved claim time survives while the key stays the same.
local function wait_fields(s, w, pv)
  if w.wk == '' then
    s.wk, s.wa, s.wn, s.wdl, s.pk, s.pt = false, false, false, false, false, false
  else
    if w.wk ~= 'p' then
      s.pk, s.pt = false, false
    elseif s.pk ~= w.wa then
      s.pk, s.pt = w.wa, false
    end
    local wa = w.wa
    if w.wk == 'a' then wa = false end
    s.wk, s.wa, s.wn, s.wdl = w.wk, wa, w.wn, w.wdl
  end
  s.wrev, s.wpv = s.rev, pv
end

-- Whether a new wait w leaves the run's dependency index as it is: no dependency before
-- and none now, or the same one (apply_wait changes no index then).
local function same_dependency(s, w)
  local was_dep = s.wk == 'c' and s.wa
  if w.wk == 'c' then return was_dep == w.wa end
  return not was_dep
end

-- Save the discovered wait w as derived from s.rev at version pv, in s and in the
-- dependency index.
local function apply_wait(run, s, w, pv)
  -- A dependency in another partition: the version its watch read, before any decision.
  local rose = w.watched and raise_mirror(w.wa, w.watched, w.ws, w.wd)
  local was_dep = s.wk == 'c' and s.wa
  if was_dep and (w.wk ~= 'c' or was_dep ~= w.wa) then
    -- Its last waiter here leaving: the dependency's watch goes too (unwatch).
    local m = mirror_of(was_dep)
    if m and m.d and idle(was_dep, run) then unwatch(was_dep, m.d, m.s) end
    ix_rem(deps_ix(was_dep), run, 0)
  end
  if w.wk == 'c' and was_dep ~= w.wa then ix_add(deps_ix(w.wa), run, 0) end
  wait_fields(s, w, pv)
  -- The mirror rose: the other waiters of that dependency here read the new version too,
  -- re-indexed as a delivery would (which, finding the mirror up to date, does nothing).
  if rose then notify_dependents(w.wa, pv) end
end

-- A poison run written or released leaves the quarantine, its takeovers counted from 0; one
-- still held is indexed again (a Hold write or its own claim leaves the lease as it is).
local function put_back(run, s)
  if not s.px then return end
  later('HDEL', QUARANTINE, 'poison|' .. run)
  s.px, s.tk = false, 0
  if s.own then index_lease(run, s, s.exp) end
end

-- The refusal of a write or delete under lease condition kind by owner, or nil. Only a
-- Claim over another owner's lease needs the clock to decide.
local function lease_refusal(s, kind, owner)
  if (kind == 'h' and s.own ~= owner)
      or (kind == 'c' and s.own and s.own ~= owner and holder(s)[2] == 1) then
    return {REFUSED, holder(s), 0, -1}
  end
  return nil
end

-- A call that needs layout 3 (delete, max_takeovers) in a namespace below it: refused, so
-- that no library that knows only layout 2 meets what it cannot read.
local function needs_layout_3()
  if NS < 3 then return {TOO_OLD, NS, 0, -1} end
  return nil
end

-- The common end of insert and compare_and_set: lease, wait, one write, indexes.
local function write(run, s, rev, record, kind, owner, ttl, w, pv)
  local was_indexable = indexable(s) and true or false
  s.rev = rev
  -- From here on the run is this state for every read of the script: an insert's run was
  -- GONE, and a run waiting on itself must see its own new revision.
  SEEN[run] = s
  put_back(run, s)
  s.tk = 0
  apply_lease(run, s, kind, owner, ttl)
  apply_wait(run, s, w, pv)
  place(run, s, pv, false, was_indexable)
  save(run, s, record)
  notify_dependents(run, pv)
  announce(run, 2 * rev)
end
