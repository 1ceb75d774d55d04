-- run_heads: the first due entries of an index of a partition (or of both), read only: what
-- a claim over many partitions reads first to give each partition its share
-- (redisstore.core.partitions).
-- KEYS[1]  P.."ready"
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."meta"
-- KEYS[4]  P.."fanout"
-- ARGV[1]  key prefix           ARGV[2] index: "ready", "leases" or "any" (both, as claim)
-- ARGV[3]  limit (at most MAX_CLAIM)
-- Reply    {OK, {run, score, ...}, pending, wait, {entry, version, ...}, outbox size,
--          {watch, ...}, {unwatch entry, watch, ...}, unwatch queue size}
--          | {TOO_NEW, layout} | {TOO_OLD, layout} | {CORRUPT, what}
--          up to limit entries due now (score <= the server's time) of each index, each in
--          its order (the caller merges them);
--          pending 1 when a dependency's waiters are still being re-indexed (the ready
--          index's claims finish that); wait: 0 when a source has more due entries than it
--          answered, else ms until its first entry not yet due, -1 when none; then up to
--          100 outbox entries ("<partition>|<run>", version) to deliver (from a bigger
--          outbox, 100 at random), and how many entries the outbox holds (a claim that
--          delivered some and left more leaves a wake-up token for the rest); for each
--          outbox entry "<w>|<run>" w's watch number of run here (0: none), which its
--          notify carries; up to 100 entries of the unwatch queue ("<partition>|<run>",
--          watch number) to send (the same way), and its size. A size -1: that queue is
--          damaged (another type, or more bytes than its entries can take), none of it read.
-- Entries are not checked against their runs: a stale one makes the partition's share too
-- big, and its claim then hands out fewer.
-- Sessions (index leases or any): the runs a lapsed session holds that are not in the leases
-- index yet are due at its expiry, as its sweep puts them there; each session due (its
-- SESSION_LEASES score passed) answers its SCARD of entries (one for a damaged entry) named
-- "~"..id, so that the partition gets a share and its claim sweeps them. The first
-- session not due counts in the wait (its runs are due at its expiry).
-- Also reads, undeclared (same hash tag): a partition's P.."outbox", P.."unwatch" and the
-- P.."watch:"..run of its outbox entries; P.."session-leases" and the P.."s:"..id of its
-- due sessions.
--- @include CORRUPT, MAX_CLAIM, MAX_TEXT, OK, now_ms, P, FANOUT, META, LEASES_IX, OUTBOX
--- @include READY_IX, UNWATCH_Q, decimal, TYPES, of_type, WATCH_KEY, arg_int, check_layout
--- @include PARTITION, MAX_INT, within, index_intact, SESSION_LEASES, SESSION_RUNS, int
local ixs
if ARGV[2] == 'ready' then
  ixs = {READY_IX}
elseif ARGV[2] == 'leases' then
  ixs = {LEASES_IX}
elseif ARGV[2] == 'any' then
  ixs = {READY_IX, LEASES_IX}
else
  error('BADARG ARGV[2] must be ready, leases or any')
end
if #KEYS ~= 4 or KEYS[1] ~= READY_IX.key or KEYS[2] ~= LEASES_IX.key or KEYS[3] ~= META
    or KEYS[4] ~= FANOUT then
  error('BADARG KEYS must be the ready, leases, meta and fanout keys of ARGV[1]')
end
local limit = arg_int(3, 0, MAX_CLAIM)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
for _, ix in ipairs(ixs) do
  if not index_intact(ix) then return {CORRUPT, 'index:' .. ix.name, 0, -1} end
end
if not of_type(FANOUT, 'zset') then return {CORRUPT, 'index:fanout', 0, -1} end
local now = now_ms()
local out, wait = {}, -1

-- Takes the entries of page (run, score, ...) that are due, up to limit from this source
-- (taken so far: n); false once it met one not due, or the limit.
local function take(page, n)
  for i = 1, #page, 2 do
    local score = tonumber(page[i + 1])
    if score then
      if score > now then
        local ms = score - now
        if wait ~= 0 and (wait < 0 or ms < wait) then wait = ms end
        return false, n
      end
      if n >= limit then
        wait = 0
        return false, n
      end
      out[#out + 1], out[#out + 2], n = page[i], page[i + 1], n + 1
    end
  end
  return true, n
end

-- Each index (the caller merges them).
for _, ix in ipairs(ixs) do
  take(redis.call('ZRANGE', ix.key, 0, limit, 'WITHSCORES'), 0)
end
-- The sessions due (see the header): counted as entries of the leases index.
if ixs[#ixs] == LEASES_IX then
  local heads = redis.pcall('ZRANGE', SESSION_LEASES, 0, limit, 'WITHSCORES')
  local n = 0
  for i = 1, (heads.err and 0 or #heads), 2 do
    local at = tonumber(heads[i + 1])
    if not at or at > MAX_INT then break end  -- inf: every run of those is in the index
    if at > now then
      local ms = math.ceil(at) - now
      if wait ~= 0 and (wait < 0 or ms < wait) then wait = ms end
      break
    end
    if n >= limit then
      wait = 0
      break
    end
    local sid = heads[i]
    -- An entry that names no session, or a run set of another type: one entry (the claim's
    -- sweep drops it). A session that holds no run here: none (a claim's sweep drops it).
    local ok = #sid <= 20 and string.find(sid, '^[1-9]%d*$')
    local runs = ok and redis.pcall('SCARD', P .. SESSION_RUNS .. sid)
    runs = type(runs) == 'number' and runs or 1
    for _ = 1, math.min(runs, limit - n) do
      out[#out + 1], out[#out + 2], n = '~' .. (ok and sid or '?'), int(math.floor(at)), n + 1
    end
  end
end
local pending = 0
if ixs[1] == READY_IX and redis.call('ZCARD', FANOUT) > 0 then pending = 1 end
-- The outbox's first entries: the claim delivers them (a damaged outbox delivers nothing).
-- Up to 100 entries of a queue (the outbox, the unwatch queue); from a bigger one, 100 at
-- random: entries that cannot be delivered yet (their partition is down) never hide the
-- others from every claim. Its size, or -1 when it is of another type or bigger than its
-- entries can be (MEMORY USAGE: a member over the longest an entry has, planted): nothing
-- of it is read, and the claim sets it aside (run_delivered).
local function queue(key)
  if not of_type(key, 'zset') then return {}, -1 end
  local n = redis.call('ZCARD', key)
  if n == 0 then return {}, 0 end
  if not within(key, 65536 + n * 2 * (MAX_TEXT + 64), n) then return {}, -1 end
  if n <= 100 then return redis.call('ZRANGE', key, 0, 99, 'WITHSCORES'), n end
  return redis.call('ZRANDMEMBER', key, 100, 'WITHSCORES'), n
end

local outbox, size = {}, 0
if PARTITION then outbox, size = queue(OUTBOX) end
-- Each entry's watch number: a notify that finds no waiter unwatches it.
local seqs = {}
for i = 1, #outbox, 2 do
  local e = outbox[i]
  local bar = string.find(e, '|', 1, true)
  local seq = 0
  if bar then
    local key = P .. WATCH_KEY .. string.sub(e, bar + 1)
    local field = string.sub(e, 1, bar - 1)
    if of_type(key, 'hash') and TYPES[key] ~= 'none' and redis.call('HSTRLEN', key, field) <= 16 then
      seq = decimal(redis.call('HGET', key, field) or '', 0, MAX_INT) or 0
    end
  end
  seqs[#seqs + 1] = seq
end
local unwatches, queued = {}, 0
if PARTITION then unwatches, queued = queue(UNWATCH_Q) end
return {OK, out, pending, wait, outbox, size, seqs, unwatches, queued}
