-- run_quarantined: one page of the quarantine, the index entries claims dropped as damaged.
-- KEYS[1]  P.."quarantine"
-- ARGV[1]  key prefix           ARGV[2] HSCAN cursor ('0' to start)
-- Reply    {OK, {next cursor, {"index|run", reason, ...}}}
--- @include CORRUPT, OK, of_type
local cursor = ARGV[2]
if type(cursor) ~= 'string' or not string.find(cursor, '^%d+$') or #cursor > 20 then
  error('BADARG ARGV[2] must be a cursor')
end
if not of_type(KEYS[1], 'hash') then return {CORRUPT, 'quarantine', 0, -1} end
return {OK, redis.call('HSCAN', KEYS[1], cursor, 'COUNT', 200), 0, -1}
