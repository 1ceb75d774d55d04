-- run_renew: extend to now + ttl every listed lease that owner holds live.
-- KEYS[1]  P.."leases"
-- KEYS[2]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4..] run ids (distinct, at most MAX_RENEW)
-- Reply    {OK, {renewed run ids, in the given order}} | {TOO_NEW, layout}
--          | {TOO_OLD, layout} | {CORRUPT, field}
--          A corrupt run among them is not renewed (and does not stop the others), nor a
--          poison run (quarantined by a claim). The grant (its token) stays. A run held
--          under a live session is answered and left as it is (it lives with the session).
-- Also touches, undeclared (same hash tag): P.."r:"..run of each listed run, P.."wake-leases"
-- (a signal, when a lease is due earlier than every other).
-- Fast path: runs lean_run reads, a ttl of at least WAKE_AHEAD, in a namespace of one
-- partition at layout 5 (lean_one.lua's lean_renew); any other case, before anything is
-- written, takes the general code.
--- @include CORRUPT, MAX_RENEW, OK, arg_int, MAX_TTL, now_ms, arg_text, LEASES_IX
--- @include index_intact, commit, check_layout, load, save, index_lease, lean_renew
local reply = lean_renew()
if reply then
  return reply
end
--- @slow
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
if #ARGV - 3 > MAX_RENEW then error('BADARG at most ' .. MAX_RENEW .. ' runs per renew') end
for i = 4, #ARGV do arg_text(i) end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if not index_intact(LEASES_IX) then return {CORRUPT, 'index:leases', 0, -1} end
local now = now_ms()
local out = {}
for i = 4, #ARGV do
  local run = ARGV[i]
  local s = load(run)
  -- An expired lease is never renewed: a renewal that arrives after a handoff must not
  -- make the old owner live again. Nor is a poison run's (live again only if the server
  -- clock stepped back): a write, a release or restore puts it back.
  if s and s.own == owner and s.exp > now and s.px ~= 'p' then
    -- A session's run lives with its session: answered, unchanged.
    if not s.sid then
      s.exp = now + ttl
      index_lease(run, s, s.exp)
      save(run, s)
    end
    out[#out + 1] = run
  end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, out, 0, -1}
