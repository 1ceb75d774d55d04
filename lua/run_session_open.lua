-- run_session_open: open a session of owner, live ttl ms from now, under a new id (or, in a
-- partition of a store of partitions, under the id partition 0 gave it).
-- KEYS[1]  P.."sessions"
-- KEYS[2]  P.."session-leases"
-- KEYS[3]  P.."session-seq"
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  optional: the session's id (1 to 20 decimal digits; '' or none: a new one)
-- Reply    {OK, id} | {SESSION_LAPSED, id} (ARGV[4] names a session this partition has or
--          had: a lapsed one never comes back) | {CORRUPT, field} | {TOO_NEW, layout}
--          | {TOO_OLD, layout}; nothing written but on OK
-- A new id is one above the last one given (session-seq): never given twice in the
-- namespace. A given id leaves session-seq as it is (a store of partitions takes its ids
-- from partition 0's alone).
-- Also reads, undeclared (same hash tag), with ARGV[4]: P.."s:"..id, P.."st:"..id.
--- @include CORRUPT, OK, now_ms, SESSION, arg_text, int, SESSION_LEASES, SESSION_SEQ
--- @include decimal, commit, arg_int, later, check_layout, MAX_INT, MAX_TTL
--- @include SESSION_LAPSED, SESSIONS, P, SESSION_RUNS, SESSION_TOLD
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
local given = SESSION.arg(4)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local id = given
if given then
  -- Never over a session this partition knows (record, entry, runs or told list, even
  -- damaged ones): that would bring a lapsed session back to life here.
  local zs = redis.pcall('ZSCORE', SESSION_LEASES, given)
  if redis.pcall('HEXISTS', SESSIONS, given) ~= 0 or zs ~= false
      or redis.call('EXISTS', P .. SESSION_RUNS .. given, P .. SESSION_TOLD .. given) > 0 then
    return {SESSION_LAPSED, given, 0, -1}
  end
else
  local kind = redis.call('TYPE', SESSION_SEQ)['ok']
  local last = 0
  if kind == 'string' then
    if redis.call('STRLEN', SESSION_SEQ) > 16 then return {CORRUPT, 'session-seq', 0, -1} end
    last = decimal(redis.call('GET', SESSION_SEQ), 0, MAX_INT - 1)
    if not last then return {CORRUPT, 'session-seq', 0, -1} end
  elseif kind ~= 'none' then
    return {CORRUPT, 'session-seq', 0, -1}
  end
  id = int(last + 1)
  later('SET', SESSION_SEQ, id)
end
local exp = now_ms() + ttl
SESSION.save(id, {exp = exp, ttl = ttl, cur = '', owner = owner})
later('ZADD', SESSION_LEASES, int(exp), id)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, id, 0, -1}
