-- repo_migrate: record the repository's layout version in the namespace, idempotently.
-- KEYS[1]  P.."repo-layout"
-- ARGV[1]  key prefix           ARGV[2] this library's layout version
-- Reply    {0, version found (0 none)} | {6, version found} when it is newer (nothing written)
local found = tonumber(redis.call('GET', KEYS[1]) or '0')
local mine = tonumber(ARGV[2])
if found > mine then return {6, found} end
if found ~= mine then redis.call('SET', KEYS[1], int(mine)) end
return {0, found}
