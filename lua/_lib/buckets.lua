-- buckets.lua: layout 4's buckets: where an entry goes, splits, and the walk in order.

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

-- A fast path's removal of run's lease entry (score exp, a decimal string): the bound of
-- its bucket and the bucket's entry count, read (ix_plan's reads for one entry); nil when
-- the directory or the bucket is of another type (the slow path's case).
local function lease_bucket(run, exp)
  local bounds = redis.pcall('ZREVRANGEBYLEX', P .. LEASES_BUCKETS .. BUCKET_DIR,
    '[' .. string.rep('0', 16 - #exp) .. exp .. run, '-', 'LIMIT', 0, 1)
  if bounds.err then return nil end
  local bound = bounds[1] or ''
  local card = redis.pcall('ZCARD', P .. LEASES_BUCKETS .. BUCKET_AT .. bound)
  if type(card) ~= 'number' then return nil end
  return bound, card
end

-- Then its writes, as ix_apply's: out of the bucket, and an emptied bucket (but the first)
-- out of the directory.
local function lease_out(run, bound, card)
  local base = P .. LEASES_BUCKETS
  if card - redis.call('ZREM', base .. BUCKET_AT .. bound, run) <= 0 and bound ~= '' then
    redis.call('ZREM', base .. BUCKET_DIR, bound)
  end
end

-- A fast path's lease entry for run (score exp, a decimal string): the bound of the bucket
-- it goes in when that bucket holds fewer than BUCKET_MAX entries (no split), else nil (as
-- when the directory or the bucket is of another type: the slow path's cases).
local function lease_bucket_in(run, exp)
  local bound, card = lease_bucket(run, exp)
  if not bound or card >= BUCKET_MAX then return nil end
  return bound
end
