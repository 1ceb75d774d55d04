-- minimal claim_ready (benchmarks/README.md): the floor of run_claim_ready on layout 5:
-- take the due entries from the head of the ready index, rewrite each run's header
-- (owner, expiry, token, claim info), move each entry from the ready index to the leases.
-- KEYS[1]  P.."ready", KEYS[2] P.."leases", KEYS[3] P.."meta", KEYS[4] P.."fanout" (not read)
-- ARGV     as run_claim_ready: [1] key prefix, [2] owner, [3] ttl ms, [4] limit;
--          [5..8] projection version, record budget, max takeovers, strict (not read: ids
--          only)
-- Reply    {0, {claimed run ids, in claim order}, 0, wait}; wait is 0 when the claim took
--          limit runs (more may be due), else -1 (not read from the index)
-- Also touches (same hash tag): P.."r:"..run of each run claimed (and of its dependency
-- for a Changed wait).
-- Commands: TIME; ZRANGE BYSCORE of the due entries (score at most now), at most limit;
-- per run claimed GETRANGE of its last 256 bytes (STRLEN too when the string is longer:
-- the header's place) and SETRANGE of its header (a Changed wait also reads its
-- dependency's header); then one ZREM of the claimed ready entries and one ZADD of their
-- leases. Left out: argument checks, the layout and index checks, the pending fan-out of a
-- dependency's waiters (none here), validation of the stored fields and of the entry
-- against its run (the index is trusted: every entry read is a free run, eligible since
-- its score), quarantine, records, signals, the wait read from the index.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
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

local out = redis.call('ZRANGE', KEYS[1], '-inf', snow, 'BYSCORE', 'LIMIT', 0, limit)
local adds = {'ZADD', KEYS[2]}
for i = 1, #out do
  local run = out[i]
  local k = P .. 'r:' .. run
  local h, from, len, size = region(k)
  local rev, _, tok, _, _, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, px, sid, _, _, lw, pos =
    string.match(h, HEADER, from)
  local wa = string.sub(h, pos, pos + lw - 1)  -- a free run: no owner, no claim key
  -- Claim info: claimed now; a Changed wait's dependency and its revision, a Poll wait's key.
  local ck, cdr = '', ''
  if wk == 'c' then
    local dh, dfrom = region(P .. 'r:' .. wa)
    ck, cdr = wa, dh and string.match(dh, '^%d+', dfrom) or '0'
  elseif wk == 'p' then
    ck, pt = wa, snow
  end
  local nh = rev .. ',' .. exp .. ',' .. (tonumber(tok) or 0) + 1 .. ',' .. cdr .. ',' .. snow ..
    ',' .. wk .. ',' .. wn .. ',' .. wdl .. ',' .. wrev .. ',' .. wpv .. ',' .. pt .. ',' ..
    tk .. ',' .. at .. ',' .. nb .. ',' .. px .. ',' .. sid .. ',' .. #owner .. ',' .. #ck ..
    ',' .. lw .. ':' .. owner .. ck .. wa
  if #nh <= size then
    redis.call('SETRANGE', k, len, nh .. string.rep(' ', size - #nh))
  else
    local digits = #nh .. ''
    redis.call('SETRANGE', k, len, nh .. digits .. #digits)
  end
  adds[2 * i + 1], adds[2 * i + 2] = exp, run
end
if #out > 0 then
  redis.call('ZREM', KEYS[1], unpack(out))
  redis.call(unpack(adds))
end
return {0, out, 0, #out >= limit and 0 or -1}
