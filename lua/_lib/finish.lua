-- finish.lua: the end of a grant (finish) and the way back from the quarantine (restore).

-- A finish's failure at ARGV[A..A+3], checked: {error, delay, max, final}, or nil when
-- ARGV[A] is the empty marker '-' (no failure). The error text is at most MAX_ERROR bytes.
local function arg_failure(A)
  local text = ARGS[A]
  if text == '-' then return nil end
  if text == nil or #text > MAX_ERROR then
    error('BADARG ARGV[' .. A .. '] must be an error text of at most ' .. MAX_ERROR ..
      ' bytes, or - for none')
  end
  local max = opt_decimal(ARGS[A + 2] or '', 1, MAX_TAKEOVERS)
  if max == nil then error('BADARG ARGV[' .. (A + 2) .. '] must be empty or attempts >= 1') end
  return {error = text, delay = arg_int(A + 1, 0, MAX_TTL), max = max,
          final = arg_flag(A + 3) == 1}
end

-- End the grant of run (state s, its revision and grant checked) without a write: free it,
-- and with a failure count an attempt, then hold it back by the failure's delay or, at its
-- last attempt (or a final one), quarantine it as failed with its error text. A session's
-- run leaves it, told (the session's keepalive reports it) unless its holder ended it.
local function finish_run(run, s, failure, pv, told)
  local by = s.own
  put_back(run, s, false)
  free(run, s, told)
  if failure then
    if s.at < MAX_TAKEOVERS then s.at = s.at + 1 end
    if failure.final or (failure.max and s.at >= failure.max) then
      s.px = 'f'
      local reason = 'final'
      if not failure.final then reason = 'attempts=' .. int(s.at) end
      later('HSET', QUARANTINE, 'failed|' .. run, reason .. '\n' .. failure.error)
    elseif failure.delay > 0 then
      s.nb = now_ms() + failure.delay
    end
  end
  place(run, s, pv, false)
  save(run, s)
  feed_note(run, s.px and 'q' or 'r', s.rev, by)
end

-- Put run (state s) back from the quarantine: its counters and back-off cleared, claimable
-- as its lease and wait say. False when it was not quarantined (nothing queued).
local function restore_run(run, s, pv)
  if not s.px then return false end
  put_back(run, s, true)
  s.nb = false
  place(run, s, pv, false)
  save(run, s)
  feed_note(run, 'b', s.rev, false)
  return true
end
