-- minimal compare_and_set with Hold (benchmarks/README.md): the floor of
-- run_compare_and_set writing the next revision of a run its writer holds, on layout 5.
-- KEYS[1]  P.."r:"..run         KEYS[2..4] P.."leases", P.."ready", P.."meta" (not read)
-- ARGV     as run_compare_and_set: [1] key prefix, [2] run, [3] expected revision,
--          [4] record, [5] 'h' (Hold), [6] owner; [7..12] ttl, wait, projection version
--          (not read: no wait)
-- Reply    {0, false, 0, -1} | {1, false, 0, -1} (no run) | {3, revision, 0, -1} (another
--          revision) | {4, {owner|false, live 0|1}, 0, -1} (held by another); nothing
--          written but on 0
-- Commands: GETRANGE of the last 256 bytes (the header: revision, holder, claim info,
-- counters; STRLEN and a GETRANGE of the header too when it is not all there), SET of
-- record .. header .. trailer (TIME only to answer a refusal). The lease and its index
-- entry stay as they are. Left out: argument checks, the layout check, validation of the
-- stored fields, the dependents' re-indexing (no run waits on it here), a wait (the record
-- has none: the run's wait fields are cleared, as the real script does), the quarantine
-- (a poison run is not put back).
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local k = KEYS[1]
local tail = redis.call('GETRANGE', k, -256, -1)
local n = #tail
if n == 0 then return {1, false, 0, -1} end
-- The trailer: the header region's length in decimal, then the count of those digits.
local d = string.byte(tail, n) - 48
local size = tonumber(string.sub(tail, n - d, n - 1))
local h, from = tail, n - d - size
if from < 1 then
  local len = redis.call('STRLEN', k) - size - d - 1
  h, from = redis.call('GETRANGE', k, len, len + size - 1), 1
end
local rev, exp, tok, cdr, cat, _, _, _, _, _, _, tk, at, _, _, sid, lo, lc, _, pos =
  string.match(h, HEADER, from)
if rev ~= ARGV[3] then return {3, tonumber(rev), 0, -1} end
local own = string.sub(h, pos, pos + lo - 1)
if own ~= ARGV[6] then
  if own == '' then return {4, {false, 0}, 0, -1} end
  local t = redis.call('TIME')
  local live = tonumber(exp) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return {4, {own, live and 1 or 0}, 0, -1}
end
-- The lease, its token, claim info and counters stay; the wait, not_before and mark go.
local nh = rev + 1 .. ',' .. exp .. ',' .. tok .. ',' .. cdr .. ',' .. cat .. ',,,,,,,' .. tk ..
  ',' .. at .. ',,,' .. sid .. ',' .. lo .. ',' .. lc .. ',0:' .. own ..
  string.sub(h, pos + lo, pos + lo + lc - 1)
local digits = #nh .. ''
redis.call('SET', k, ARGV[4] .. nh .. digits .. #digits)
return {0, false, 0, -1}
