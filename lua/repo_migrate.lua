-- repo_migrate: record the repository's layout version in the namespace, idempotently.
-- KEYS[1]  P.."repo-layout"
-- ARGV[1]  key prefix           ARGV[2] this library's layout version
-- Reply    {OK, version found (0 none)} | {TOO_NEW, version found} when it is newer
--          | {CORRUPT, 'repo-layout'} (nothing written on either)
-- Also reads, undeclared (same hash tag): P.."repo-partitions" (spread: the repository's
-- count).
--- @include CORRUPT, OK, TOO_NEW, P, int, decimal, arg_int, wrong_type, arg_key, reply
--- @include spread
local layout = arg_key(1, P .. 'repo-layout')
local mine = arg_int(2, 1, 1000000)
local refused = spread()
if refused then return refused end
local got = redis.pcall('GET', layout)
if type(got) == 'table' then
  wrong_type(got)
  return reply(CORRUPT, 'repo-layout')
end
local found = 0
if got then
  found = decimal(got, 1, 1000000)
  if not found then return reply(CORRUPT, 'repo-layout') end
end
if found > mine then return reply(TOO_NEW, found) end
if found ~= mine then redis.call('SET', layout, int(mine)) end
return reply(OK, found)
