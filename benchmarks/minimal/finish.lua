-- minimal finish (benchmarks/README.md): the floor of run_finish on layout 5, a finish
-- sent alone (an AsyncWorker's at concurrency): write a run's record as its next revision
-- and free it.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."leases", KEYS[3..4] P.."ready", P.."meta"
--          (not read)
-- ARGV     as run_finish: [1] key prefix, [2] run, [3] expected revision, [4] owner, [5]
--          the grant's token, [6] 'w' (a record), [7] record; [8..16] failure, wait,
--          projection version (not read: no failure, no wait)
-- Reply    {0, false, 0, -1} | {1, false, 0, -1} (no run) | {3, revision, 0, -1} (another
--          revision) | {4, {owner|false, live 0|1}, 0, -1} (not that grant); nothing written
--          but on 0
-- Commands: GETRANGE of the last 256 bytes (STRLEN and a GETRANGE of the header too when it
-- is not all there), SET of record .. header .. trailer (the revision and the token alone:
-- no lease, claim info, wait or counters), ZREM of its lease entry (TIME only to answer a
-- refusal). Left out: argument checks, the layout check, validation of the stored fields,
-- a failure or a release without a record, a wait in the record (none here), the
-- dependents' re-indexing, the quarantine.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local k = KEYS[1]
local tail = redis.call('GETRANGE', k, -256, -1)
local n = #tail
if n == 0 then return {1, false, 0, -1} end
local d = string.byte(tail, n) - 48
local size = tonumber(string.sub(tail, n - d, n - 1))
local h, from = tail, n - d - size
if from < 1 then
  local len = redis.call('STRLEN', k) - size - d - 1
  h, from = redis.call('GETRANGE', k, len, len + size - 1), 1
end
local rev, exp, tok, _, _, _, _, _, _, _, _, _, _, _, _, sid, lo, _, _, pos =
  string.match(h, HEADER, from)
if rev ~= ARGV[3] then return {3, tonumber(rev), 0, -1} end
local own = string.sub(h, pos, pos + lo - 1)
if own ~= ARGV[4] or tok ~= ARGV[5] then
  if own == '' then return {4, {false, 0}, 0, -1} end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return {4, {own, tonumber(exp) > now and 1 or 0}, 0, -1}
end
local nh = rev + 1 .. ',,' .. tok .. ',,,,,,,,,,,,,' .. sid .. ',0,0,0:'
local digits = #nh .. ''
redis.call('SET', k, ARGV[7] .. nh .. digits .. #digits)
redis.call('ZREM', KEYS[2], ARGV[2])
return {0, false, 0, -1}
