-- repo_register_group: establish an engine group, idempotently.
-- KEYS[1]  P.."groups"
-- ARGV[1]  key prefix           ARGV[2] group
-- Reply    {OK, 1 added | 0 known} | {CORRUPT, 'index:groups'} (nothing written)
-- Also reads, undeclared (same hash tag): P.."repo-partitions" (spread: the repository's
-- count).
--- @include CORRUPT, OK, GROUPS, arg_text, arg_key, of_type, reply, spread
local groups = arg_key(1, GROUPS)
local group = arg_text(2)
local refused = spread()
if refused then return refused end
if not of_type(groups, 'set') then return reply(CORRUPT, 'index:groups') end
return reply(OK, redis.call('SADD', groups, group))
