-- run_get: read one run.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run
-- Reply    {OK, {revision, record, owner|false, live 0|1, claim_key|false,
--           claim_dep_rev|false, claimed_at|false}}  (claim fields '' mean None)
--          {NOT_FOUND} | {CORRUPT, field} | {TOO_NEW, layout}
--- @include CORRUPT, NOT_FOUND, OK, check_layout, load, record_of, current
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, bad = load(ARGV[2])
if s == nil then return {NOT_FOUND, false, 0, -1} end
if s == false then return {CORRUPT, bad, 0, -1} end
local rec = record_of(ARGV[2], s)
if not rec then return {CORRUPT, 'rec', 0, -1} end
return {OK, current(s, rec), 0, -1}
