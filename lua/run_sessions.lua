-- run_sessions: a page of the sessions: live ones, and lapsed ones that still hold runs.
-- KEYS[1]  P.."session-leases"
-- KEYS[2]  P.."sessions"
-- ARGV[1]  key prefix           ARGV[2] offset            ARGV[3] count (1 .. MAX_RENEW)
-- Reply    {OK, {{id, owner, expiry, runs}, ...}, read} (by expiry; lapsed sessions whose runs all
--          went into the leases index last); an entry naming no session is left out
-- Also touches, undeclared (same hash tag): P.."s:"..id (counted).
--- @include MAX_RENEW, OK, P, SESSION, SESSION_LEASES, SESSION_RUNS, arg_int, MAX_INT
--- @include now_ms
local offset = arg_int(2, 0, MAX_INT)
local count = arg_int(3, 1, MAX_RENEW)
local ids = redis.pcall('ZRANGE', SESSION_LEASES, offset, offset + count - 1)
if ids.err then return {OK, {}, 0, -1} end  -- of another type: none listed
local out = {}
for _, sid in ipairs(ids) do
  local sn = #sid <= 20 and string.find(sid, '^[1-9]%d*$') and SESSION.of(sid)
  if sn then
    local n = redis.pcall('SCARD', P .. SESSION_RUNS .. sid)
    n = type(n) == 'number' and n or 0
    -- A lapsed session holding no run is gone (the next claim's sweep removes it).
    if n > 0 or sn.exp > now_ms() then out[#out + 1] = {sid, sn.owner, sn.exp, n} end
  end
end
return {OK, out, #ids, -1}
