-- minimal claim_expired (benchmarks/README.md): the floor of run_claim_expired on
-- layout 4: take the due entries from the head of the leases index, rewrite each run's
-- header (new owner and expiry, a takeover counted), move each entry to its new place.
-- KEYS[1]  P.."leases", KEYS[2] P.."meta" (not read)
-- ARGV     as run_claim_expired: [1] key prefix, [2] owner, [3] ttl ms, [4] limit;
--          [5..7] record budget, max takeovers, strict (not read: ids only, no bound)
-- Reply    {0, {claimed run ids, in claim order}, 0, wait}; wait is 0 when the claim took
--          limit runs (more may be due), else -1 (not read from the index)
-- Also touches (same hash tag): P.."r:"..run of each run claimed, P.."L/" (the leases
-- directory), P.."L|"..bound (its buckets).
-- Commands: TIME; ZRANGE of the first bucket's first limit entries (and of the next
-- buckets while every entry read was due: ZRANGEBYLEX of the directory for their bounds);
-- per run claimed GETRANGE of its last 192 bytes and SETRANGE of its header; then the
-- entries' new bucket (ZREVRANGEBYLEX and ZRANGEBYLEX of the directory: its bound and the
-- next, asked again only for an entry past it), one ZREM per bucket left (+ EXISTS: an
-- emptied bucket leaves the directory) and one ZADD per bucket entered (+ ZCARD: a bucket
-- past 128 entries is split). Left out: argument checks, the layout and index checks,
-- validation of the stored fields and of the entry against its run (the index is
-- trusted: every entry read is a held run whose lease expired at its score), quarantine,
-- poison runs, records, signals.
local P, owner = ARGV[1], ARGV[2]
local who = #owner .. ':' .. owner
local limit = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = string.format('%d', now + tonumber(ARGV[3]))
local dir, pre = P .. 'L/', P .. 'L|'

-- Whether byte string a sorts before b, as the server compares.
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Split bucket pre..b when it holds more than 128 entries, as lua/_lib/buckets.lua's split.
local function split(b, n)
  if n <= 128 then return end
  local all = redis.call('ZRANGE', pre .. b, 0, -1, 'WITHSCORES')
  local parts = math.floor(n / 64)
  redis.call('DEL', pre .. b)
  for p = 1, parts do
    local from, last = (p - 1) * 128 + 1, #all
    if p < parts then last = p * 128 end
    local bound = b
    if p > 1 then bound = string.rep('0', 16 - #all[from + 1]) .. all[from + 1] .. all[from] end
    local args = {'ZADD', pre .. bound}
    for i = from, last, 2 do
      args[#args + 1] = all[i + 1]
      args[#args + 1] = all[i]
    end
    redis.call(unpack(args))
    if p > 1 then redis.call('ZADD', dir, 0, bound) end
  end
end

-- The due entries, bucket by bucket in order: run -> the bound of the bucket it is in.
local out, from = {}, {}
local bounds, nb, b = nil, 0, ''
while #out < limit do
  local page = redis.call('ZRANGE', pre .. b, 0, limit - #out - 1, 'WITHSCORES')
  local later = false
  for i = 1, #page, 2 do
    if tonumber(page[i + 1]) > now then
      later = true
      break
    end
    out[#out + 1], from[page[i]] = page[i], b
  end
  -- Every entry read was due and fewer than asked came: the bucket is done.
  if later or #out >= limit then break end
  -- The next bucket, from the directory (16 bounds a read).
  if bounds == nil or nb >= #bounds then
    bounds = redis.call('ZRANGEBYLEX', dir, b == '' and '-' or '(' .. b, '+', 'LIMIT', 0, 16)
    nb = 0
  end
  nb = nb + 1
  b = bounds[nb]
  if b == nil then break end
end

-- Each run's header: owner, expiry; another owner's claim info goes and a takeover counts.
local TEXT = {[2] = true, [4] = true, [8] = true, [13] = true}
for _, run in ipairs(out) do
  local k = P .. 'r:' .. run
  local tail = redis.call('GETRANGE', k, -192, -1)
  local d = tonumber(string.sub(tail, -1))
  local size = tonumber(string.sub(tail, -1 - d, -2))
  local total = #tail
  if total == 192 then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  local h
  if size + d + 1 <= #tail then
    h = string.sub(tail, -size - d - 1, -d - 2)
  else
    h = redis.call('GETRANGE', k, len, len + size - 1)
  end
  local f, pos = {}, 1
  for i = 1, 17 do
    local c = string.byte(h, pos)
    if c == nil or c == 32 then
      for j = i, 17 do f[j] = '' end
      break
    end
    local e
    if TEXT[i] and c ~= 44 then
      local digits = string.match(h, '^%d+', pos)
      e = pos + #digits + 1 + tonumber(digits)
    else
      e = string.find(h, ',', pos, true)
    end
    f[i] = string.sub(h, pos, e - 1)
    pos = e + 1
  end
  if f[2] ~= who then
    f[4], f[5], f[6] = '', '', ''
    local tk = f[15] == '' and 0 or tonumber(f[15])
    if tk < 2147483648 then f[15] = string.format('%d', tk + 1) end
  end
  f[2], f[3] = who, exp
  local n = 17
  while n > 1 and f[n] == '' do n = n - 1 end
  local nh = table.concat(f, ',', 1, n) .. ','
  if #nh <= size then
    redis.call('SETRANGE', k, len, nh .. string.rep(' ', size - #nh))
  else
    local digits = tostring(#nh)
    redis.call('SETRANGE', k, len, nh .. digits .. #digits)
  end
end

-- Where each entry goes: every new composite has the score exp; the bucket found for one
-- answers for the next while it lies below the next bound.
local zexp = string.rep('0', 16 - #exp) .. exp
local to, adds, aorder = {}, {}, {}
local lo, hi = nil, nil
for _, run in ipairs(out) do
  local c = zexp .. run
  if lo == nil or before(c, lo) or (hi and not before(c, hi)) then
    lo = redis.call('ZREVRANGEBYLEX', dir, '[' .. c, '-', 'LIMIT', 0, 1)[1] or ''
    hi = redis.call('ZRANGEBYLEX', dir, '(' .. c, '+', 'LIMIT', 0, 1)[1]
  end
  to[run] = lo
  if not adds[lo] then
    adds[lo] = {}
    aorder[#aorder + 1] = lo
  end
  local a = adds[lo]
  a[#a + 1], a[#a + 2] = exp, run
end
-- Out of the buckets left (an entry that stays in its bucket is only re-scored by ZADD).
local rems, rorder = {}, {}
for _, run in ipairs(out) do
  local fb = from[run]
  if fb ~= to[run] then
    if not rems[fb] then
      rems[fb] = {}
      rorder[#rorder + 1] = fb
    end
    rems[fb][#rems[fb] + 1] = run
  end
end
for _, fb in ipairs(rorder) do
  redis.call('ZREM', pre .. fb, unpack(rems[fb]))
  if fb ~= '' and not adds[fb] and redis.call('EXISTS', pre .. fb) == 0 then
    redis.call('ZREM', dir, fb)
  end
end
for _, tb in ipairs(aorder) do
  if redis.call('ZADD', pre .. tb, unpack(adds[tb])) > 0 then
    split(tb, redis.call('ZCARD', pre .. tb))
  end
end
return {0, out, 0, #out >= limit and 0 or -1}
