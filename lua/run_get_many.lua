-- run_get_many: read many runs, their records within a byte budget.
-- KEYS[1]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] byte budget of the records (the first run is read
--          whatever its size)
-- ARGV[3..] run ids (distinct, at most MAX_RENEW)
-- Reply    {OK, {read, {run, current}, ...}}: read, how many of the listed runs were looked
--          at, in order (the rest would pass the budget: the caller asks again); each of
--          them that exists, with run_get's current, or {run, false, field} where it is
--          corrupt | {TOO_NEW, layout} | {TOO_OLD, layout}
-- Each record is sized (from its header) before it is read: one that does not fit costs
-- nothing, and one longer than any store writes is corrupt ('record'), unread.
-- Also reads, undeclared (same hash tag): P.."r:"..run of each listed run.
--- @include MAX_CLAIM_BYTES, MAX_RENEW, OK, arg_int, arg_text, check_layout, load
--- @include record_of, current
local budget = arg_int(2, 1, MAX_CLAIM_BYTES)
if #ARGV - 2 > MAX_RENEW then error('BADARG at most ' .. MAX_RENEW .. ' runs per get_many') end
for i = 3, #ARGV do arg_text(i) end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local out, spent, read = {0}, 0, 0
for i = 3, #ARGV do
  local run = ARGV[i]
  local s, bad = load(run)
  if s == false then
    out[#out + 1] = {run, false, bad}
  elseif s then
    if read > 0 and spent + s.len > budget then break end
    local rec = record_of(run, s)
    if rec then
      spent = spent + s.len
      out[#out + 1] = {run, current(s, rec)}
    else
      out[#out + 1] = {run, false, 'record'}
    end
  end
  read = i - 2
end
out[1] = read
return {OK, out, 0, -1}
