-- run_get: read one run.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run
-- Reply    {OK, {revision, record, owner|false, live 0|1, claim_key|false,
--           claim_dep_rev|false, claimed_at|false}}  (claim fields '' mean None)
--          {NOT_FOUND} | {CORRUPT, field} | {TOO_NEW, layout}
-- Fast path: a run kept as a string whose header the lean readers take (raw_run), in a
-- namespace of one partition at layout 4 (as its meta records): the layout, its header,
-- its record (and the clock for a held run); any other case (a run missing or damaged...)
-- takes the slow path.
--- @include CORRUPT, NOT_FOUND, OK, check_layout, load, record_of, current
--- @include P, RUN_KEY, raw_run, lean_layout
if not ARGV[2] or not lean_layout() then return SLOW() end
local k = P .. RUN_KEY .. ARGV[2]
local rev, own, exp, ck, cdr, cat, _, _, _, _, _, _, _, _, tk, _, _, len = raw_run(k)
if not rev then return SLOW() end
local live = 0
if own == '' then
  own = false
else
  own = string.sub(own, string.find(own, ':', 1, true) + 1)
  local t = redis.call('TIME')
  if tonumber(exp) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then live = 1 end
end
if cat == '' then
  ck, cat = false, false
else
  ck, cat = ck ~= '' and string.sub(ck, string.find(ck, ':', 1, true) + 1), tonumber(cat)
end
local rec = ''
if len > 0 then rec = redis.call('GETRANGE', k, 0, len - 1) end
return {OK, {tonumber(rev), rec, own, live, ck, cdr, cat, tonumber(tk) or 0}, 0, -1}
--- @slow
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, bad = load(ARGV[2])
if s == nil then return {NOT_FOUND, false, 0, -1} end
if s == false then return {CORRUPT, bad, 0, -1} end
local rec = record_of(ARGV[2], s)
if not rec then return {CORRUPT, 'rec', 0, -1} end
return {OK, current(s, rec), 0, -1}
