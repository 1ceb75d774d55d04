-- minimal claim (benchmarks/README.md): the floor of run_claim on layout 5: read the
-- due heads of both indexes, merge them by score (ties by run id), and take each as its
-- own claim does: a ready run as claim_ready.lua, an expired lease as claim_expired.lua.
-- KEYS[1]  P.."ready", KEYS[2] P.."leases", KEYS[3] P.."meta", KEYS[4] P.."fanout" (not read)
-- ARGV     as run_claim: [1] key prefix, [2] owner, [3] ttl ms, [4] limit; [5..8]
--          projection version, record budget, max takeovers, strict (not read: ids only,
--          no bound)
-- Reply    {0, {claimed run ids, in claim order}, 0, wait}; wait is 0 when the claim took
--          limit runs (more may be due), else -1 (not read from the indexes)
-- Also touches (same hash tag): P.."r:"..run of each run claimed (and of its dependency
-- for a Changed wait).
-- Commands: TIME; per index ZRANGE BYSCORE WITHSCORES of its due entries (score at most
-- now), at most limit; per run claimed GETRANGE of its last 256 bytes (STRLEN too when the
-- string is longer: the header's place) and SETRANGE of its header (a Changed wait also
-- reads its dependency's header); then one ZREM of the claimed ready entries and one ZADD
-- of every claimed lease. Left out: as claim_ready.lua and claim_expired.lua leave out.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local MAX_TAKEOVERS = 2147483648
local P, owner, limit = ARGV[1], ARGV[2], tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local snow = string.format('%d', now)
local exp = string.format('%d', now + tonumber(ARGV[3]))

-- The header region of run key k: its text, where the header starts in it, the record's
-- length and the region's size.
local function region(k)
  local tail = redis.call('GETRANGE', k, -256, -1)
  local n = #tail
  if n == 0 then return nil end
  local d = string.byte(tail, n) - 48
  local size = tonumber(string.sub(tail, n - d, n - 1))
  local total = n
  if n == 256 then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  if size + d + 1 <= n then return tail, n - d - size, len, size end
  return redis.call('GETRANGE', k, len, len + size - 1), 1, len, size
end

-- Whether byte string a sorts before b, as the server compares members (a tie of scores).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local ready = redis.call('ZRANGE', KEYS[1], '-inf', snow, 'BYSCORE', 'LIMIT', 0, limit,
  'WITHSCORES')
local leases = redis.call('ZRANGE', KEYS[2], '-inf', snow, 'BYSCORE', 'LIMIT', 0, limit,
  'WITHSCORES')
local out, rems, adds = {}, {'ZREM', KEYS[1]}, {'ZADD', KEYS[2]}
local r, l = 1, 1
while #out < limit do
  local run, from_ready
  if ready[r] and (not leases[l] or tonumber(ready[r + 1]) < tonumber(leases[l + 1]) or
      (ready[r + 1] == leases[l + 1] and before(ready[r], leases[l]))) then
    run, from_ready, r = ready[r], true, r + 2
  elseif leases[l] then
    run, from_ready, l = leases[l], false, l + 2
  else
    break
  end
  local k = P .. 'r:' .. run
  local h, from, len, size = region(k)
  local rev, _, tok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, px, sid, lo, lc, lw, pos =
    string.match(h, HEADER, from)
  local ck = string.sub(h, pos + lo, pos + lo + lc - 1)
  local wa = string.sub(h, pos + lo + lc, pos + lo + lc + lw - 1)
  if from_ready then
    -- A free run: claimed now, with its wait's claim info (as claim_ready.lua).
    ck, cdr, cat = '', '', snow
    if wk == 'c' then
      local dh, dfrom = region(P .. 'r:' .. wa)
      ck, cdr = wa, dh and string.match(dh, '^%d+', dfrom) or '0'
    elseif wk == 'p' then
      ck, pt = wa, snow
    end
    rems[#rems + 1] = run
  else
    -- An expired lease: a lost try, and from another owner a takeover (as claim_expired.lua).
    if string.sub(h, pos, pos + lo - 1) ~= owner then
      cdr, cat, ck = '', '', ''
      tk = tonumber(tk) or 0
      if tk < MAX_TAKEOVERS then tk = tk + 1 end
    end
    at = tonumber(at) or 0
    if at < MAX_TAKEOVERS then at = at + 1 end
  end
  local nh = rev .. ',' .. exp .. ',' .. (tonumber(tok) or 0) + 1 .. ',' .. cdr .. ',' .. cat ..
    ',' .. wk .. ',' .. wn .. ',' .. wdl .. ',' .. wrev .. ',' .. wpv .. ',' .. pt .. ',' ..
    tk .. ',' .. at .. ',' .. nb .. ',' .. px .. ',' .. sid .. ',' .. #owner .. ',' .. #ck ..
    ',' .. lw .. ':' .. owner .. ck .. wa
  if #nh <= size then
    redis.call('SETRANGE', k, len, nh .. string.rep(' ', size - #nh))
  else
    local digits = #nh .. ''
    redis.call('SETRANGE', k, len, nh .. digits .. #digits)
  end
  out[#out + 1] = run
  adds[#adds + 1], adds[#adds + 2] = exp, run
end
if #rems > 2 then redis.call(unpack(rems)) end
if #out > 0 then redis.call(unpack(adds)) end
return {0, out, 0, #out >= limit and 0 or -1}
