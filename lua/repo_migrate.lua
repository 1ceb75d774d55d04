-- repo_migrate: record the repository's layout version in the namespace, idempotently.
-- KEYS[1]  P.."repo-layout"
-- ARGV[1]  key prefix           ARGV[2] this library's layout version
-- Reply    {OK, version found (0 none)} | {TOO_NEW, version found} when it is newer
--          | {CORRUPT, 'repo-layout'} (nothing written on either)
-- Also reads, undeclared (same hash tag): P.."repo-partitions" (spread: the repository's
-- count).
--- @include CORRUPT, OK, TOO_NEW, REPO_LAYOUT, int, arg_int, arg_key, reply, stored_int
--- @include spread
local layout = arg_key(1, REPO_LAYOUT)
local mine = arg_int(2, 1, 1000000)
local refused = spread()
if refused then return refused end
-- Bounded before it is read (stored_int): a planted long value is corrupt, unread.
local found = stored_int(layout, 1, 1000000)
if found == false then return reply(CORRUPT, 'repo-layout') end
found = found or 0
if found > mine then return reply(TOO_NEW, found) end
if found ~= mine then redis.call('SET', layout, int(mine)) end
return reply(OK, found)
