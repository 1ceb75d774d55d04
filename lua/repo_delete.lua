-- repo_delete: remove one instance record and its index entries; a no-op when absent.
-- KEYS[1]  the record's hash    KEYS[2] P.."terminal"
-- ARGV[1]  key prefix           ARGV[2] id
-- Reply    {0}
-- Also touches, undeclared (same hash tag): the record's group index, known only once read.
local group = redis.call('HGET', KEYS[1], 'g')
if not group then return {0} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', inflight_key(group), ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
return {0}
