-- minimal compare_and_set with Release (benchmarks/README.md): the floor of
-- run_compare_and_set writing the next revision of a run and freeing it, on layout 5.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."leases", KEYS[3..4] P.."ready", P.."meta"
--          (not read)
-- ARGV     as run_compare_and_set: [1] key prefix, [2] run, [3] expected revision,
--          [4] record, [5] 'r' (Release); [6..12] owner, ttl, wait, projection version
--          (not read: no wait)
-- Reply    {0, false, 0, -1} | {1, false, 0, -1} (no run) | {3, revision, 0, -1} (another
--          revision); nothing written but on 0
-- Commands: GETRANGE of the last 256 bytes (the header: revision, token, holder; STRLEN
-- and a GETRANGE of the header too when it is not all there), SET of record .. header ..
-- trailer (the header keeps the revision and the token alone: no lease, no claim info, no
-- wait, counters cleared), and for a held run ZREM of its lease entry. Left out: argument
-- checks, the layout check, validation of the stored fields, the dependents' re-indexing,
-- a wait (the record has none), the quarantine.
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
local rev, _, tok, _, _, _, _, _, _, _, _, _, _, _, _, sid, lo = string.match(h, HEADER, from)
if rev ~= ARGV[3] then return {3, tonumber(rev), 0, -1} end
local nh = rev + 1 .. ',,' .. tok .. ',,,,,,,,,,,,,' .. sid .. ',0,0,0:'
local digits = #nh .. ''
redis.call('SET', k, ARGV[4] .. nh .. digits .. #digits)
if lo ~= '0' then redis.call('ZREM', KEYS[2], ARGV[2]) end
return {0, false, 0, -1}
