-- minimal insert (benchmarks/README.md): the floor of run_insert with a Claim on
-- layout 5: the run's string and its lease index entry.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."leases", KEYS[3] P.."ready" (not read)
-- KEYS[4]  P.."meta"
-- ARGV     as run_insert: [1] key prefix, [2] run, [3] record, [4] 'c' (Claim), [5] owner,
--          [6] ttl ms; [7..11] the wait and projection version (not read: no wait)
-- Reply    {0, revision, 0, -1} | {2, false, 0, -1} (the run exists; nothing written)
-- Commands: HMGET meta deleted-rev deleted-tok (the revision and the grant token start
-- above them), TIME (the lease's expiry), SET NX of record .. header .. trailer (the
-- existence check and the write in one), ZADD of the lease entry. Left out: argument
-- checks, the layout check, validation of meta's fields, the dependents' re-indexing (no
-- run waits on a new id here), a wait (the record has none), wake-up signals.
local run, owner = ARGV[2], ARGV[5]
local floor = redis.call('HMGET', KEYS[4], 'deleted-rev', 'deleted-tok')
local rev = (tonumber(floor[1]) or 0) + 1
local t = redis.call('TIME')
local exp = string.format('%d',
  tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[6]))
-- rev, exp, tok, then 13 fields empty (no claim info, wait, counters, mark), the texts.
local h = rev .. ',' .. exp .. ',' .. (tonumber(floor[2]) or 0) + 1 .. ',,,,,,,,,,,,,,' ..
  #owner .. ',0,0:' .. owner
local digits = #h .. ''
if not redis.call('SET', KEYS[1], ARGV[3] .. h .. digits .. #digits, 'NX') then
  return {2, false, 0, -1}
end
redis.call('ZADD', KEYS[2], exp, run)
return {0, rev, 0, -1}
