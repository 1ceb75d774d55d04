-- run_refresh: re-derive a run's wait from its current record (the caller ran discover on
-- the record it read at revision expected); changes no record, revision or lease.
-- KEYS[1]  the run's hash       KEYS[2] P.."ready"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4..7] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[8]  projection version
-- Reply    {0, indexed 0|1} | {1} not found | {3, current} the record moved on meanwhile
local k, run = KEYS[1], ARGV[2]
local rev = redis.call('HGET', k, 'rev')
if not rev then return {1} end
if tonumber(rev) ~= tonumber(ARGV[3]) then return {3, tonumber(rev)} end
local now = now_ms()
local pv = tonumber(ARGV[8])
set_wait(k, run, ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(rev), pv)
reindex(k, run, now, pv, false)
if ARGV[4] == '' then return {0, 0} end
return {0, 1}
