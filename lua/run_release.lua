-- run_release: free every listed lease that owner holds, live or expired, without a write.
-- KEYS[1]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[2]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[3]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] caller's projection version
-- ARGV[4..] run ids (distinct, at most MAX_RENEW)
-- Reply    {OK, {released run ids, in the given order}} | {TOO_NEW, layout}
--          | {CORRUPT, field} (an index key of another type: nothing written)
--          A corrupt run among them is not released (and does not stop the others).
-- The revision and record stay; claim info goes with the lease; a run with a wait is placed
-- in READY as its wait says (at once when due); a poison run leaves the quarantine.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each listed run, P.."r:"..dep
-- of a Changed wait (read), P.."quarantine" (a poison run released), P.."wake-ready" and
-- P.."wake-leases" (signals).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
--- @include CORRUPT, MAX_RENEW, OK, arg_int, arg_text, LEASES_IX, ix_rem, commit
--- @include check_layout, load, save, place, drop_claim, put_back
local owner = arg_text(2)
local pv = arg_int(3, 0, 2147483648)
if #ARGV - 3 > MAX_RENEW then error('BADARG at most ' .. MAX_RENEW .. ' runs per release') end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local out = {}
for i = 4, #ARGV do
  local run = ARGV[i]
  local s = load(run)
  if s and s.own == owner then
    put_back(run, s)
    drop_claim(s)
    s.own, s.exp = false, false
    ix_rem(LEASES_IX, run, s.lx)
    place(run, s, pv, false)
    save(run, s)
    out[#out + 1] = run
  end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, out, 0, -1}
