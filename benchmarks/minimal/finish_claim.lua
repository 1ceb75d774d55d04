-- minimal finish_claim (benchmarks/README.md): the floor of run_finish_claim on layout 5,
-- the job cycle's unit: finish a run with a record (its next revision, the run freed), then
-- claim the next runs (claim.lua's claim), one script.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."leases", KEYS[3] P.."ready"
-- KEYS[4]  P.."meta", KEYS[5] P.."fanout" (not read)
-- ARGV     as run_finish_claim: [1] key prefix, [2] n (15: run_finish's ARGV[2..16]),
--          [3 .. n + 2] the finish's: [3] run, [4] expected revision, [5] owner, [6] the
--          grant's token, [7] 'w' (a record), [8] record; [9..17] failure, wait, projection
--          version (not read: no failure, no wait); [n + 3] the claim's kind ('any', 'ready'
--          or 'leases'); [n + 4 ..] the claim's: owner, ttl ms, limit, projection version
--          (not read), record budget (0: ids only, else the records too; no bound), max
--          takeovers, strict (not read)
-- Reply    {{0, false, 0, -1}, {0, {claimed run ids, or {run, current} with records (current
--          as run_get's, no session)}, 0, wait}} (wait 0 when the claim took limit runs,
--          else -1: not read from the indexes) | {{1, false, 0, -1}, false} (no run) | {{3,
--          revision, 0, -1}, false} (another revision) | {{4, {owner|false, live 0|1}, 0,
--          -1}, false} (not that grant); nothing written but on 0
-- Also touches (same hash tag): P.."r:"..run of each run claimed (and of its dependency
-- for a Changed wait).
-- Commands: the finish's GETRANGE of the last 256 bytes (STRLEN and a GETRANGE of the
-- header too when it is not all there), SET of record .. header .. trailer (the revision
-- and the token alone: no lease, claim info, wait or counters), ZREM of its lease entry
-- (TIME only to answer a refusal); then the claim's commands, as claim.lua's (the record of
-- a claimed run comes from its GETRANGE when the value is shorter than 256 bytes, else one
-- GETRANGE more). Left out: what claim.lua leaves out; for the finish, argument checks, the
-- layout check, validation of the stored fields, a failure or a release without a record,
-- a wait in the record (none here), the dependents' re-indexing, the quarantine.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local MAX_TAKEOVERS = 2147483648
local P, c = ARGV[1], tonumber(ARGV[2]) + 2

-- The header region of run key k: its text, where the header starts in it, the record's
-- length, the region's size, and the whole value when shorter than 256 bytes (else false).
local function region(k)
  local tail = redis.call('GETRANGE', k, -256, -1)
  local n = #tail
  if n == 0 then return nil end
  local d = string.byte(tail, n) - 48
  local size = tonumber(string.sub(tail, n - d, n - 1))
  local total, whole = n, tail
  if n == 256 then total, whole = redis.call('STRLEN', k), false end
  local len = total - size - d - 1
  if size + d + 1 <= n then return tail, n - d - size, len, size, whole end
  return redis.call('GETRANGE', k, len, len + size - 1), 1, len, size, whole
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The finish: revision expected and the grant (owner, token) checked, the record written
-- as the next revision, the run freed.
local fk, owner = KEYS[1], ARGV[5]
local h, from = region(fk)
if not h then return {{1, false, 0, -1}, false} end
local rev, exp, tok, _, _, _, _, _, _, _, _, _, _, _, _, sid, lo, _, _, pos =
  string.match(h, HEADER, from)
if rev ~= ARGV[4] then return {{3, tonumber(rev), 0, -1}, false} end
local own = string.sub(h, pos, pos + lo - 1)
if own ~= owner or tok ~= ARGV[6] then
  if own == '' then return {{4, {false, 0}, 0, -1}, false} end
  return {{4, {own, tonumber(exp) > now_ms() and 1 or 0}, 0, -1}, false}
end
local nh = rev + 1 .. ',,' .. tok .. ',,,,,,,,,,,,,' .. sid .. ',0,0,0:'
local digits = #nh .. ''
redis.call('SET', fk, ARGV[8] .. nh .. digits .. #digits)
redis.call('ZREM', KEYS[2], ARGV[3])

-- The claim, as claim.lua's (of the kind asked), on what the finish left.
local kind, owner2, limit, budget = ARGV[c + 1], ARGV[c + 2], tonumber(ARGV[c + 4]),
  tonumber(ARGV[c + 6])
local now = now_ms()
local snow = string.format('%d', now)
local exp2 = string.format('%d', now + tonumber(ARGV[c + 3]))

local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local ready, leases = {}, {}
if kind ~= 'leases' then
  ready = redis.call('ZRANGE', KEYS[3], '-inf', snow, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
end
if kind ~= 'ready' then
  leases = redis.call('ZRANGE', KEYS[2], '-inf', snow, 'BYSCORE', 'LIMIT', 0, limit,
    'WITHSCORES')
end
local out, rems, adds = {}, {'ZREM', KEYS[3]}, {'ZADD', KEYS[2]}
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
  local rh, rfrom, len, size, whole = region(k)
  local rrev, _, rtok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, px, rsid, rlo, lc, lw,
    rpos = string.match(rh, HEADER, rfrom)
  local ck = string.sub(rh, rpos + rlo, rpos + rlo + lc - 1)
  local wa = string.sub(rh, rpos + rlo + lc, rpos + rlo + lc + lw - 1)
  if from_ready then
    ck, cdr, cat = '', '', snow
    if wk == 'c' then
      local dh, dfrom = region(P .. 'r:' .. wa)
      ck, cdr = wa, dh and string.match(dh, '^%d+', dfrom) or '0'
    elseif wk == 'p' then
      ck, pt = wa, snow
    end
    rems[#rems + 1] = run
  else
    if string.sub(rh, rpos, rpos + rlo - 1) ~= owner2 then
      cdr, cat, ck = '', '', ''
      tk = tonumber(tk) or 0
      if tk < MAX_TAKEOVERS then tk = tk + 1 end
    end
    at = tonumber(at) or 0
    if at < MAX_TAKEOVERS then at = at + 1 end
  end
  local ntok = (tonumber(rtok) or 0) + 1
  local rnh = rrev .. ',' .. exp2 .. ',' .. ntok .. ',' .. cdr .. ',' .. cat .. ',' .. wk .. ',' ..
    wn .. ',' .. wdl .. ',' .. wrev .. ',' .. wpv .. ',' .. pt .. ',' .. tk .. ',' .. at .. ',' ..
    nb .. ',' .. px .. ',' .. rsid .. ',' .. #owner2 .. ',' .. #ck .. ',' .. lw .. ':' .. owner2 ..
    ck .. wa
  if #rnh <= size then
    redis.call('SETRANGE', k, len, rnh .. string.rep(' ', size - #rnh))
  else
    local rdigits = #rnh .. ''
    redis.call('SETRANGE', k, len, rnh .. rdigits .. #rdigits)
  end
  if budget > 0 then
    local rec = ''
    if whole then
      rec = string.sub(whole, 1, len)
    elseif len > 0 then
      rec = redis.call('GETRANGE', k, 0, len - 1)
    end
    out[#out + 1] = {run, {tonumber(rrev), rec, owner2, 1, cat ~= '' and ck, cdr,
      cat ~= '' and tonumber(cat), tonumber(tk) or 0, ntok, tonumber(at) or 0,
      nb ~= '' and tonumber(nb), px, false}}
  else
    out[#out + 1] = run
  end
  adds[#adds + 1], adds[#adds + 2] = exp2, run
end
if #rems > 2 then redis.call(unpack(rems)) end
if #out > 0 then redis.call(unpack(adds)) end
return {{0, false, 0, -1}, {0, out, 0, #out >= limit and 0 or -1}}
