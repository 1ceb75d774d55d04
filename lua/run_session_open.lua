-- run_session_open: open a session of owner, live ttl ms from now, under a new id.
-- KEYS[1]  P.."sessions"
-- KEYS[2]  P.."session-leases"
-- KEYS[3]  P.."session-seq"
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- Reply    {OK, id} | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}; nothing
--          written but on OK
-- The id is one above the last one given (session-seq): never given twice in the namespace.
--- @include CORRUPT, OK, now_ms, SESSION, arg_text, int, SESSION_LEASES, SESSION_SEQ
--- @include decimal, commit, arg_int, later, check_layout, MAX_INT, MAX_TTL
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local kind = redis.call('TYPE', SESSION_SEQ)['ok']
local last = 0
if kind == 'string' then
  if redis.call('STRLEN', SESSION_SEQ) > 16 then return {CORRUPT, 'session-seq', 0, -1} end
  last = decimal(redis.call('GET', SESSION_SEQ), 0, MAX_INT - 1)
  if not last then return {CORRUPT, 'session-seq', 0, -1} end
elseif kind ~= 'none' then
  return {CORRUPT, 'session-seq', 0, -1}
end
local id = int(last + 1)
local exp = now_ms() + ttl
later('SET', SESSION_SEQ, id)
SESSION.save(id, {exp = exp, ttl = ttl, cur = '', owner = owner})
later('ZADD', SESSION_LEASES, int(exp), id)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, id, 0, -1}
