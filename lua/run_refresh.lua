-- run_refresh: re-derive a run's wait from its current record (the caller ran discover on
-- the record it read at revision expected); changes no record, revision or lease.
-- KEYS[1]  the run's hash       KEYS[2] P.."ready"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4..7] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[8]  projection version
-- Reply    {0, indexed 0|1} | {1} not found | {3, current} the record moved on meanwhile
local k, run = KEYS[1], ARGV[2]
local s = load(k)
if not s.rev then return {1} end
if tonumber(s.rev) ~= tonumber(ARGV[3]) then return {3, tonumber(s.rev)} end
local pv = tonumber(ARGV[8])
local was_indexed = indexable(s)
local set, del = {}, {}
apply_wait(run, s, ARGV[4], ARGV[5], ARGV[6], ARGV[7], pv, set, del)
flush(k, set, del)
place(run, s, was_indexed, pv, false)
if ARGV[4] == '' then return {0, 0} end
return {0, 1}
