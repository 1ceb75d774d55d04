-- repo_register_group: establish an engine group, idempotently.
-- KEYS[1]  P.."groups"
-- ARGV[1]  key prefix           ARGV[2] group
-- Reply    {0}
redis.call('SADD', KEYS[1], ARGV[2])
return {0}
