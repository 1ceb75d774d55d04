-- repo_group_exists: whether an engine group is registered.
-- KEYS[1]  P.."groups"
-- ARGV[1]  key prefix           ARGV[2] group
-- Reply    {0, 1|0}
return {0, redis.call('SISMEMBER', KEYS[1], ARGV[2])}
