-- run_restore: put a quarantined run (poison, or failed) back: out of the quarantine, its
-- takeovers, attempts and not_before cleared, claimable again as its lease and wait say.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases"
-- KEYS[3]  P.."ready"
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] caller's projection version
-- ARGV[4]  optional: the revision the caller expects ('' or absent: any)
-- Reply    {OK, 1} (it was quarantined: put back) | {OK, 0} (it was not: nothing written)
--          | {CONFLICT, revision} (not at the revision expected: nothing written)
--          | {NOT_FOUND} | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}
-- Also touches, undeclared (same hash tag): P.."quarantine", P.."r:"..dep of a Changed wait
-- (read), P.."wake-ready" and P.."wake-leases" (signals).
--- @include CONFLICT, CORRUPT, NOT_FOUND, OK, arg_int, arg_text, check_layout, load, commit
--- @include restore_run, decimal, MAX_INT
local run = arg_text(2)
local pv = arg_int(3, 0, 2147483648)
-- The checked restore (the dashboard's action): the revision the caller saw, compared in
-- this script, so no write between its read and this restore goes unseen.
local expected = ARGV[4] or ''
if expected ~= '' then
  expected = decimal(expected, 0, MAX_INT)
  if expected == nil then error('BADARG ARGV[4] must be empty or a revision') end
end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, bad = load(run)
if s == nil then return {NOT_FOUND, false, 0, -1} end
if s == false then return {CORRUPT, bad, 0, -1} end
if expected ~= '' and s.rev ~= expected then return {CONFLICT, s.rev, 0, -1} end
if not restore_run(run, s, pv) then return {OK, 0, 0, -1} end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, 1, 0, -1}
