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
--- @include CORRUPT, MAX_CLAIM, MAX_CLAIM_BYTES, OK, arg_int, arg_flag, WAKE_LEASES
--- @include MAX_TTL, now_ms, opt_decimal, arg_text, DROPPED, LEASES_IX, index_intact
--- @include commit, check_layout, MAX_TAKEOVERS, due, wait_after_claim, needs_layout_3
--- @include take_expired
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
  if take_expired(run, s, owner, ttl, now, bound, budget, strict, out) then break end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, out, DROPPED, wait_after_claim(WAKE_LEASES, LEASES_IX, #out, false)}
