-- run_session_close: one step of a session's close: release up to count of the runs it
-- holds (as release does), and once it holds none, end it.
-- KEYS[1]  P.."sessions"
-- KEYS[2]  P.."session-leases"
-- KEYS[3]  P.."leases"
-- KEYS[4]  P.."ready"
-- KEYS[5]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] session id        ARGV[3] owner
-- ARGV[4]  count (1 .. MAX_RENEW)                          ARGV[5] caller's projection version
-- Reply    {OK, {released, done 0|1}} | {CORRUPT, field} | {TOO_NEW, layout}
--          | {TOO_OLD, layout}; a session that is not there (closed, gone) or another
--          owner's: {OK, {0, 1}}, nothing written
-- Each run released is freed as release frees it (a released event, its wait placed); the
-- session need not be live (a lapsed one's runs left in it go too). Once its set is empty,
-- its record, its SESSION_LEASES entry and its told list go: later keepalives and claims
-- answer SESSION_LAPSED.
-- Also touches, undeclared (same hash tag): P.."s:"..id, P.."st:"..id, P.."r:"..run of each
-- run released, P.."quarantine", P.."wake-ready" (signals), and what a release touches.
--- @include CORRUPT, MAX_RENEW, OK, P, load, SESSION, finish_run, arg_text, SESSIONS, int
--- @include SESSION_LEASES, commit, SESSION_RUNS, SESSION_TOLD, arg_int, later
--- @include check_layout
local sid = SESSION.arg(2)
if not sid then error('BADARG ARGV[2] must be a session id') end
local owner = arg_text(3)
local count = arg_int(4, 1, MAX_RENEW)
local pv = arg_int(5, 0, 2147483648)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local sn = SESSION.of(sid)
if not sn or sn.owner ~= owner then return {OK, {0, 1}, 0, -1} end
local set = P .. SESSION_RUNS .. sid
local size = redis.pcall('SCARD', set)
if type(size) ~= 'number' then return {CORRUPT, 'session:' .. sid, 0, -1} end
local step = size > 0 and redis.call('SRANDMEMBER', set, count) or {}
local released = 0
for _, run in ipairs(step) do
  local s = load(run)
  if s and s.sid and int(s.sid) == sid then
    finish_run(run, s, nil, pv, false)
    released = released + 1
  else
    later('SREM', set, run)  -- not the session's run (any more): a stale member
  end
end
local done = 0
if size <= #step then
  later('HDEL', SESSIONS, sid)
  later('ZREM', SESSION_LEASES, sid)
  later('DEL', P .. SESSION_TOLD .. sid, set)
  done = 1
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, {released, done}, 0, -1}
