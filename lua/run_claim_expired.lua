-- run_claim_expired: claim up to limit held, expired leases, the longest-expired first.
-- KEYS[1]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[2]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] owner             ARGV[3] ttl ms
-- ARGV[4]  limit (at most MAX_CLAIM)
-- ARGV[5]  record budget: 0 for ids only, else bytes (at most MAX_CLAIM_BYTES) of records
--          to hand back with the runs; the claim stops before the run that would pass it
-- ARGV[6]  max takeovers: '' for no bound, else a run already taken over that many times is
--          quarantined as poison instead of claimed (layout 3 only)
-- ARGV[7]  '1': the budget holds for the first run too (a claim over partitions, in all
--          but one of them); absent or '': the first run always comes
-- Reply    {OK, {claimed run ids, in claim order}, dropped, wait} | {TOO_NEW, layout}
--          | {TOO_OLD, layout} (a bound below layout 3)
--          with records: {OK, {{run, current}, ...}, dropped, wait} (current as run_get)
-- In layout 3 a claim from another owner than the expired holder counts a takeover (tk);
-- a poison run leaves the index, keeps its holder and is listed as "poison|run".
-- Visits at most limit + MAX_VISIT index entries. The run's own expiry decides, not the
-- index score: an entry whose run is missing, of another type or corrupt is quarantined;
-- one whose run is free (or a poison run's) is dropped; one whose lease was extended is
-- re-scored.
-- Also touches, undeclared (same hash tag): P.."r:"..run of each entry visited (read; written
-- when claimed), P.."quarantine" (an entry quarantined), P.."wake-leases" (signals).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
--- @include CORRUPT, MAX_CLAIM, MAX_CLAIM_BYTES, OK, int, arg_int, arg_flag, later
--- @include QUARANTINE, WAKE_LEASES, NS, MAX_TTL, now_ms, opt_decimal, arg_text, DROPPED
--- @include LEASES_IX, ix_rem, ix_add, index_intact, unsignal, commit, check_layout
--- @include MAX_TAKEOVERS, save, due, current, claimed_record, wait_after_claim, hold
--- @include needs_layout_3
local owner = arg_text(2)
local ttl = arg_int(3, 1, MAX_TTL)
local limit = arg_int(4, 0, MAX_CLAIM)
local budget = arg_int(5, 0, MAX_CLAIM_BYTES)
local strict = arg_flag(7)
local bound = opt_decimal(ARGV[6], 0, MAX_TAKEOVERS)
if bound == nil then error('BADARG ARGV[6] must be empty or an integer in [0, ' ..
  MAX_TAKEOVERS .. ']') end
local bad_layout = check_layout() or (bound and needs_layout_3())
if bad_layout then return bad_layout end
if not index_intact(LEASES_IX) then return {CORRUPT, 'index:leases', 0, -1} end
local now = now_ms()
local out = {}
for run, s in due(LEASES_IX, limit, out) do
  if not s.own or s.px then
    ix_rem(LEASES_IX, run, s.lx)
  elseif s.exp > now then
    ix_add(LEASES_IX, run, s.exp, s.lx)
  elseif s.own ~= owner and bound and s.tk >= bound then
    -- A poison run: out of every claim until a write or a release puts it back.
    ix_rem(LEASES_IX, run, s.lx)
    later('HSET', QUARANTINE, 'poison|' .. run, 'takeovers=' .. int(s.tk))
    DROPPED = DROPPED + 1
    s.px = true
    save(run, s)
  else
    local rec = budget > 0 and claimed_record(run, s, budget, #out + strict, LEASES_IX)
    if rec == nil then break end  -- the records would pass the budget: stop before it
    if budget == 0 or rec then
      if s.own ~= owner and NS >= 3 and s.tk < MAX_TAKEOVERS then s.tk = s.tk + 1 end
      hold(run, s, owner, now + ttl)
      unsignal(WAKE_LEASES, run)
      save(run, s)
      if budget > 0 then out[#out + 1] = {run, current(s, rec)} else out[#out + 1] = run end
    end
  end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, out, DROPPED, wait_after_claim(WAKE_LEASES, LEASES_IX, #out, false)}
