-- repo_load: read one instance record, every field checked.
-- KEYS[1]  P.."inst:"..id (the record)
-- ARGV[1]  key prefix           ARGV[2] id
-- Reply    {OK, {version, payload, group, tenant, expiry µs|'', offset µs, owner,
--           incarnation, status}} | {NOT_FOUND, false} | {CORRUPT, field}
-- Also reads, undeclared (same hash tag): P.."repo-partitions" (spread: the repository's
-- count).
--- @include CORRUPT, NOT_FOUND, OK, inst_key, arg_text, arg_key, reply, spread
--- @include load_record
local k = arg_key(1, inst_key(arg_text(2)))
local refused = spread()
if refused then return refused end
local r, bad = load_record(k, {'v', 'pl', 'g', 't', 'x', 'xo', 'o', 'n', 's', 'k'})
if r == false then return reply(CORRUPT, bad) end
if r == nil then return reply(NOT_FOUND, false) end
return reply(OK, {r.v, r.pl, r.g, r.t, r.x, r.xo, r.o, r.n, r.s})
