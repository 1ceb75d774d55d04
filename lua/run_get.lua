-- run_get: read one run.
-- KEYS[1]  the run's hash
-- ARGV[1]  key prefix
-- Reply    {0, revision, record, owner|false, live 0|1, claim_key|false, claim_dep_rev|false,
--           claimed_at|false}   (claim fields '' mean None)
--          {1} not found
local f = redis.call('HMGET', KEYS[1], 'rev', 'rec', 'own', 'exp', 'ck', 'cdr', 'cat')
if not f[1] then return {1} end
local own, live = holder(f[3], f[4])
return {0, tonumber(f[1]), f[2], own, live, f[5], f[6], f[7]}
