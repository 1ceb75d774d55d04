-- minimal claim_expired (benchmarks/README.md): the floor of run_claim_expired on
-- layout 5: take the due entries from the head of the leases index, rewrite each run's
-- header (new owner, expiry and token, a lost try counted, a takeover from another owner),
-- re-score each entry.
-- KEYS[1]  P.."leases", KEYS[2] P.."meta" (not read)
-- ARGV     as run_claim_expired: [1] key prefix, [2] owner, [3] ttl ms, [4] limit;
--          [5..8] projection version, record budget, max takeovers, strict (not read: ids
--          only, no bound)
-- Reply    {0, {claimed run ids, in claim order}, 0, wait}; wait is 0 when the claim took
--          limit runs (more may be due), else -1 (not read from the index)
-- Also touches (same hash tag): P.."r:"..run of each run claimed.
-- Commands: TIME; ZRANGE BYSCORE of the due entries (score at most now), at most limit;
-- per run claimed GETRANGE of its last 256 bytes (STRLEN too when the string is longer:
-- the header's place) and SETRANGE of its header; one ZADD of every claimed entry at its
-- new expiry. Left out: argument checks, the layout and index checks, validation of the
-- stored fields and of the entry against its run (the index is trusted: every entry read
-- is a held run whose lease expired at its score), quarantine and poison runs, records,
-- signals, the wait read from the index.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local MAX_TAKEOVERS = 2147483648
local P, owner, limit = ARGV[1], ARGV[2], tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = string.format('%d', now + tonumber(ARGV[3]))
local out = redis.call('ZRANGE', KEYS[1], '-inf', string.format('%d', now), 'BYSCORE',
  'LIMIT', 0, limit)
local adds = {'ZADD', KEYS[1]}
for i = 1, #out do
  local run = out[i]
  local k = P .. 'r:' .. run
  local tail = redis.call('GETRANGE', k, -256, -1)
  local n = #tail
  local d = string.byte(tail, n) - 48
  local size = tonumber(string.sub(tail, n - d, n - 1))
  local total = n
  if n == 256 then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  local h, from = tail, n - d - size
  if from < 1 then h, from = redis.call('GETRANGE', k, len, len + size - 1), 1 end
  local rev, _, tok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, px, sid, lo, lc, lw, pos =
    string.match(h, HEADER, from)
  local ck = string.sub(h, pos + lo, pos + lo + lc - 1)
  local wa = string.sub(h, pos + lo + lc, pos + lo + lc + lw - 1)
  if string.sub(h, pos, pos + lo - 1) ~= owner then
    -- Another owner's: a takeover; claim info belongs to the expired holder.
    cdr, cat, ck = '', '', ''
    tk = tonumber(tk) or 0
    if tk < MAX_TAKEOVERS then tk = tk + 1 end
  end
  at = tonumber(at) or 0
  if at < MAX_TAKEOVERS then at = at + 1 end
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
  adds[2 * i + 1], adds[2 * i + 2] = exp, run
end
if #out > 0 then redis.call(unpack(adds)) end
return {0, out, 0, #out >= limit and 0 or -1}
