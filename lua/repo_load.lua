-- repo_load: read one instance record.
-- KEYS[1]  the record's hash
-- ARGV[1]  key prefix
-- Reply    {0, version, payload, group, tenant, expiry µs|'', offset µs, owner, incarnation,
--           status} | {1} not found
local f = redis.call('HMGET', KEYS[1], 'v', 'pl', 'g', 't', 'x', 'xo', 'o', 'n', 's')
if not f[1] then return {1} end
return {0, f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]}
