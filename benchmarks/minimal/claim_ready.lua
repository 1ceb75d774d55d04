-- minimal claim_ready (benchmarks/README.md): the floor of run_claim_ready on
-- layout 4: take the due entries from the head of the ready index, rewrite each run's
-- header (owner, expiry, claim info), move each entry from the ready index to the leases.
-- KEYS[1]  P.."ready", KEYS[2] P.."leases", KEYS[3] P.."meta", KEYS[4] P.."fanout" (not read)
-- ARGV     as run_claim_ready: [1] key prefix, [2] owner, [3] ttl ms, [4] limit;
--          [5..7] projection version, record budget, strict (not read: ids only)
-- Reply    {0, {claimed run ids, in claim order}, 0, wait}; wait is 0 when the claim took
--          limit runs (more may be due), else -1 (not read from the index)
-- Also touches (same hash tag): P.."r:"..run of each run claimed (and of its dependency for
-- a Changed wait), P.."Q/", P.."Q|"..bound (the ready index), P.."L/", P.."L|"..bound (the
-- leases index).
-- Commands: TIME; ZRANGE of the first ready bucket's first limit entries (and of the next
-- buckets while every entry read was due: ZRANGEBYLEX of the directory for their bounds);
-- per run claimed GETRANGE of its last 192 bytes and SETRANGE of its header (a Changed
-- wait also reads its dependency's header); then one ZREM per ready bucket left (+ EXISTS:
-- an emptied bucket leaves the directory), the leases entries' bucket (ZREVRANGEBYLEX and
-- ZRANGEBYLEX of the directory: its bound and the next, asked again only for an entry past
-- it) and one ZADD per leases bucket entered (+ ZCARD: a bucket past 128 entries is split).
-- Left out: argument checks, the layout and index checks, the pending fan-out of a
-- dependency's waiters (none here), validation of the stored fields and of the entry
-- against its run (the index is trusted: every entry read is a free run, eligible since its
-- score), quarantine, records, signals.
local P, owner = ARGV[1], ARGV[2]
local who = #owner .. ':' .. owner
local limit = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local snow = string.format('%d', now)
local exp = string.format('%d', now + tonumber(ARGV[3]))
local qdir, qpre, ldir, lpre = P .. 'Q/', P .. 'Q|', P .. 'L/', P .. 'L|'

-- Whether byte string a sorts before b, as the server compares.
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Split leases bucket b when it holds more than 128 entries, as lua/_lib/buckets.lua's split.
local function split(b, n)
  if n <= 128 then return end
  local all = redis.call('ZRANGE', lpre .. b, 0, -1, 'WITHSCORES')
  local parts = math.floor(n / 64)
  redis.call('DEL', lpre .. b)
  for p = 1, parts do
    local from, last = (p - 1) * 128 + 1, #all
    if p < parts then last = p * 128 end
    local bound = b
    if p > 1 then bound = string.rep('0', 16 - #all[from + 1]) .. all[from + 1] .. all[from] end
    local args = {'ZADD', lpre .. bound}
    for i = from, last, 2 do
      args[#args + 1] = all[i + 1]
      args[#args + 1] = all[i]
    end
    redis.call(unpack(args))
    if p > 1 then redis.call('ZADD', ldir, 0, bound) end
  end
end

-- The header region of run key k: its text, the record's length, the region's size.
local function header(k)
  local tail = redis.call('GETRANGE', k, -192, -1)
  if tail == '' then return nil end
  local d = tonumber(string.sub(tail, -1))
  local size = tonumber(string.sub(tail, -1 - d, -2))
  local total = #tail
  if total == 192 then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  if size + d + 1 <= #tail then return string.sub(tail, -size - d - 1, -d - 2), len, size end
  return redis.call('GETRANGE', k, len, len + size - 1), len, size
end

-- The due ready entries, bucket by bucket in order: run -> the bound of its bucket.
local out, from = {}, {}
local bounds, nb, b = nil, 0, ''
while #out < limit do
  local page = redis.call('ZRANGE', qpre .. b, 0, limit - #out - 1, 'WITHSCORES')
  local later = false
  for i = 1, #page, 2 do
    if tonumber(page[i + 1]) > now then
      later = true
      break
    end
    out[#out + 1], from[page[i]] = page[i], b
  end
  if later or #out >= limit then break end
  if bounds == nil or nb >= #bounds then
    bounds = redis.call('ZRANGEBYLEX', qdir, b == '' and '-' or '(' .. b, '+', 'LIMIT', 0, 16)
    nb = 0
  end
  nb = nb + 1
  b = bounds[nb]
  if b == nil then break end
end

-- Each run's header: held by owner until exp, claimed now (claim key: a Changed wait's
-- dependency with its revision, a Poll wait's key, else ''), no ready time.
local TEXT = {[2] = true, [4] = true, [8] = true, [13] = true}
for _, run in ipairs(out) do
  local k = P .. 'r:' .. run
  local h, len, size = header(k)
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
  f[2], f[3], f[4], f[5], f[6], f[17] = who, exp, '0:', '', snow, ''
  if f[7] == 'c' then
    f[4] = f[8]
    local dh = header(P .. 'r:' .. string.sub(f[8], string.find(f[8], ':', 1, true) + 1))
    f[5] = dh and string.sub(dh, 1, string.find(dh, ',', 1, true) - 1) or '0'
  elseif f[7] == 'p' then
    f[4], f[14] = f[8], snow
  end
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

-- Out of the ready buckets.
local rems, rorder = {}, {}
for _, run in ipairs(out) do
  local fb = from[run]
  if not rems[fb] then
    rems[fb] = {}
    rorder[#rorder + 1] = fb
  end
  rems[fb][#rems[fb] + 1] = run
end
-- Into the leases buckets: every new composite has the score exp; the bucket found for one
-- answers for the next while it lies below the next bound.
local zexp = string.rep('0', 16 - #exp) .. exp
local adds, aorder = {}, {}
local lo, hi = nil, nil
for _, run in ipairs(out) do
  local c = zexp .. run
  if lo == nil or before(c, lo) or (hi and not before(c, hi)) then
    lo = redis.call('ZREVRANGEBYLEX', ldir, '[' .. c, '-', 'LIMIT', 0, 1)[1] or ''
    hi = redis.call('ZRANGEBYLEX', ldir, '(' .. c, '+', 'LIMIT', 0, 1)[1]
  end
  if not adds[lo] then
    adds[lo] = {}
    aorder[#aorder + 1] = lo
  end
  local a = adds[lo]
  a[#a + 1], a[#a + 2] = exp, run
end
for _, fb in ipairs(rorder) do
  redis.call('ZREM', qpre .. fb, unpack(rems[fb]))
  if fb ~= '' and redis.call('EXISTS', qpre .. fb) == 0 then redis.call('ZREM', qdir, fb) end
end
for _, tb in ipairs(aorder) do
  if redis.call('ZADD', lpre .. tb, unpack(adds[tb])) > 0 then
    split(tb, redis.call('ZCARD', lpre .. tb))
  end
end
return {0, out, 0, #out >= limit and 0 or -1}
