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
-- Fast path: one run, held by owner, without a wait, not poison, in a namespace of one
-- partition at layout 4 (as its meta records), whose header the lean readers take (raw_run):
-- the reads, then its header rewritten in place and its lease entry out of its bucket, every
-- byte as the slow path's save and commit make them; any other case, before anything is
-- written, takes the slow path.
--- @include CORRUPT, MAX_RENEW, OK, arg_int, arg_text, LEASES_IX, ix_rem, commit
--- @include check_layout, load, save, place, drop_claim, put_back
--- @include P, RUN_KEY, MAX_TEXT, READY_BUCKETS, BUCKET_DIR, dec15, raw_run, lean_layout
--- @include lease_bucket, lease_out, trailer
local who, run, pv = ARGV[2], ARGV[4], ARGV[3]
if ARGV[5] or not run or who == '' or #who > MAX_TEXT or not dec15(pv)
    or tonumber(pv) > 2147483648 or not lean_layout() then
  return SLOW()
end
local k = P .. RUN_KEY .. run
local rev, own, exp, _, _, _, wk, _, _, _, _, _, _, _, tk, px, rt, len, region = raw_run(k)
if not rev or own ~= #who .. ':' .. who or wk ~= '' or px ~= '' or rt ~= '' then
  return SLOW()
end
-- Its ready entry: none (no ready time); the slow path asks the type of the ready index's
-- directory all the same (place, then ix_plan).
local t = redis.pcall('TYPE', P .. READY_BUCKETS .. BUCKET_DIR)
t = type(t) == 'table' and t.ok or t
if t ~= 'zset' and t ~= 'none' then return SLOW() end
local bound, card = lease_bucket(run, exp)
if not bound then return SLOW() end
-- The header without lease and claim info (tk as it was), in its region as save writes it.
local h = rev .. ','
if tk ~= '' and tk ~= '0' then h = rev .. string.rep(',', 14) .. tk .. ',' end
if #h <= region then
  redis.call('SETRANGE', k, len, h .. string.rep(' ', region - #h))
else
  redis.call('SETRANGE', k, len, h .. trailer(#h))
end
lease_out(run, bound, card)
return {OK, {run}, 0, -1}
--- @slow
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
