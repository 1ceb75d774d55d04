-- run_get: read one run.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run
-- Reply    {OK, current} (leases.lua's current: revision, record, holder, claim info,
--          takeovers, token, attempts, not_before, quarantined)
--          | {NOT_FOUND} | {CORRUPT, field} | {TOO_NEW, layout} | {TOO_OLD, layout}
-- A record longer than any store writes (a value planted beside a header) is CORRUPT
-- 'record', unread.
-- Fast path: a run lean_run reads, in a namespace of one partition at layout 5
-- (lean_one.lua's lean_get); any other case takes the general code.
--- @include CORRUPT, NOT_FOUND, OK, arg_text, check_layout, load, record_of, current
--- @include lean_get
local reply = lean_get()
if reply then
  return reply
end
--- @slow
local run = arg_text(2)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, bad = load(run)
if s == nil then return {NOT_FOUND, false, 0, -1} end
if s == false then return {CORRUPT, bad, 0, -1} end
local rec = record_of(run, s)
if not rec then return {CORRUPT, 'record', 0, -1} end
return {OK, current(s, rec), 0, -1}
