-- run_session_keepalive: keep a live session live ttl ms from now, in one call whatever the
-- number of its runs; answer the runs others took from it since the last keepalive.
-- KEYS[1]  P.."sessions"
-- KEYS[2]  P.."session-leases"
-- KEYS[3]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] session id        ARGV[3] owner
-- Reply    {OK, {run ids taken from it, at most MAX_RENEW: the rest at the next}}
--          | {SESSION_LAPSED, id} (expired, closed, never opened, or another owner's: it
--          never comes back) | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout};
--          nothing written but on OK
-- Also touches, undeclared (same hash tag): P.."st:"..id (the runs taken from it).
--- @include CORRUPT, MAX_RENEW, MAX_TEXT, OK, now_ms, P, QUARANTINE, SESSION, arg_text
--- @include int, SESSION_LEASES, commit, SESSION_TOLD, later, check_layout, within
local sid = SESSION.arg(2)
if not sid then error('BADARG ARGV[2] must be a session id') end
local owner = arg_text(3)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local sn, lapsed = SESSION.live(sid, owner)
if not sn then return lapsed end
-- The runs told: a list of run ids, sized before it is read (one of another type, or holding
-- more bytes than its count of ids could, goes, listed in the quarantine).
local list = P .. SESSION_TOLD .. sid
local told = {}
local n = redis.pcall('LLEN', list)
if type(n) ~= 'number' or not within(list, n * (MAX_TEXT + 16) + 1024, n) then
  later('HSET', QUARANTINE, 'session-told|' .. sid, 'damaged')
  later('DEL', list)
elseif n > 0 then
  local got = redis.call('LRANGE', list, 0, MAX_RENEW - 1)
  later('LTRIM', list, #got, -1)
  -- Only run ids are told (a server without MEMORY USAGE lets a planted big entry through).
  for i = 1, #got do
    if #got[i] <= MAX_TEXT then told[#told + 1] = got[i] end
  end
end
sn.exp = now_ms() + sn.ttl
SESSION.save(sid, sn)
later('ZADD', SESSION_LEASES, int(sn.exp), sid)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, told, 0, -1}
