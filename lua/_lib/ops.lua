-- ops.lua: the operations a script may run one after the other (a finish, a write or a
-- release, then a claim: run_finish_claim...). Each is two functions: its arguments (ARGS,
-- laid out as its own script's ARGV) read and checked into a table, before anything is read
-- or written; then the operation on them, which answers its own reply. Their own scripts
-- call the two in a row.

-- compare_and_set's arguments: ARGS as run_compare_and_set's ARGV.
local function cas_args()
  local a = {run = arg_text(2), expected = arg_int(3, 0, MAX_INT - 2), record = arg_record(4)}
  a.kind, a.owner, a.ttl = arg_lease(5)
  a.w, a.pv = arg_wait(8)
  return a
end

local function op_cas(a)
  local bad_layout = check_layout()
  if bad_layout then return bad_layout end
  local s, refusal = load_at(a.run, a.expected)
  if not s then return refusal end
  if s.rev >= MAX_INT - 1 then return {CORRUPT, 'rev', 0, -1} end
  refusal = lease_refusal(s, a.kind, a.owner, a.ttl)
  if refusal then return refusal end
  local again = rewatch(a.w)
  if again then return again end
  write(a.run, s, s.rev + 1, a.record, a.kind, a.owner, a.ttl, a.w, a.pv)
  local bad_write = commit()
  if bad_write then return {CORRUPT, bad_write, 0, -1} end
  return {OK, false, 0, -1}
end

-- finish's arguments: ARGS as run_finish's ARGV.
local function finish_args()
  local a = {run = arg_text(2), expected = arg_int(3, 0, MAX_INT - 2), owner = arg_text(4),
             token = arg_int(5, 1, MAX_INT), what = ARGS[6], record = arg_record(7)}
  if a.what ~= 'w' and a.what ~= 'r' and a.what ~= 'x' then
    error('BADARG ARGV[6] must be w (a record), r (a release) or x (a failure)')
  end
  a.failure = arg_failure(8)
  if (a.what == 'x') ~= (a.failure ~= nil) then
    error('BADARG ARGV[8] must be an error text for a failure (x), else -')
  end
  a.w, a.pv = arg_wait(12)
  return a
end

local function op_finish(a)
  local bad_layout = check_layout()
  if bad_layout then return bad_layout end
  local s, refusal = load_at(a.run, a.expected)
  if not s then return refusal end
  if s.rev >= MAX_INT - 1 then return {CORRUPT, 'rev', 0, -1} end
  refusal = lease_refusal(s, 'F', a.owner, a.token)
  if refusal then return refusal end
  if a.what == 'w' then
    local again = rewatch(a.w)
    if again then return again end
    write(a.run, s, s.rev + 1, a.record, 'F', a.owner, a.token, a.w, a.pv)
  else
    finish_run(a.run, s, a.failure, a.pv, false)
  end
  FEED_STATE.counts.f = FEED_STATE.counts.f + 1
  local bad_write = commit()
  if bad_write then return {CORRUPT, bad_write, 0, -1} end
  rates_send()
  return {OK, false, 0, -1}
end

-- release's arguments: ARGS as run_release's ARGV.
local function release_args()
  local a = {owner = arg_text(2), pv = arg_int(3, 0, 2147483648), runs = {}}
  if #ARGS - 3 > MAX_RENEW then error('BADARG at most ' .. MAX_RENEW .. ' runs per release') end
  for i = 4, #ARGS do a.runs[#a.runs + 1] = arg_text(i) end
  return a
end

local function op_release(a)
  local bad_layout = check_layout()
  if bad_layout then return bad_layout end
  local out = {}
  for _, run in ipairs(a.runs) do
    local s = load(run)
    if s and s.own == a.owner then
      finish_run(run, s, nil, a.pv, true)
      out[#out + 1] = run
    end
  end
  local bad_write = commit()
  if bad_write then return {CORRUPT, bad_write, 0, -1} end
  return {OK, out, 0, -1}
end

-- A claim's arguments: ARGS as run_claim's ARGV.
local function claim_args()
  local a = {owner = arg_text(2), ttl = arg_int(3, 1, MAX_TTL), limit = arg_int(4, 0, MAX_CLAIM),
             pv = arg_int(5, 0, 2147483648), budget = arg_int(6, 0, MAX_CLAIM_BYTES),
             bound = opt_decimal(ARGS[7] or '', 0, MAX_TAKEOVERS), strict = arg_flag(8),
             session = SESSION.arg(9)}
  if a.bound == nil then
    error('BADARG ARGV[7] must be empty or an integer in [0, ' .. MAX_TAKEOVERS .. ']')
  end
  return a
end

-- A claim of kind 'ready', 'leases' or 'any' (both, in due order).
local function op_claim(kind, a)
  local bad_layout = check_layout()
  if bad_layout then return bad_layout end
  if a.session then  -- a session's claim: its runs go under the session, live or refused
    local sn, lapsed = SESSION.live(a.session, a.owner)
    if not sn then return lapsed end
    SESSION.join, SESSION.exp = a.session, sn.exp
  end
  local ready, leases = kind ~= 'leases', kind ~= 'ready'
  if leases then SESSION.sweep(a.limit + MAX_VISIT) end
  local more_pending = false
  if ready then
    local bad
    more_pending, bad = reindex_first(a.pv)
    if bad then return bad end
  end
  local now, limit = now_ms(), a.limit
  local out = {}
  -- The head of each index, read one ahead; the earlier goes first (ties by run id). A run
  -- is in one index at a time; if a stale entry names it in both, the state both see is the
  -- same table (load caches it), so the second meets the run as the first left it.
  local next_ready = ready and due(READY_IX, limit, out)
  local next_lease = leases and due(LEASES_IX, limit, out)
  local rr, rs, rt, lr, ls, lt
  while #out < limit do
    if next_ready and not rr then
      rr, rs, rt = next_ready()
      if not rr then next_ready = nil end
    end
    if next_lease and not lr then
      lr, ls, lt = next_lease()
      if not lr then next_lease = nil end
    end
    local stop
    if rr and (not lr or rt < lt or (rt == lt and bytes_before(rr, lr))) then
      stop = take_ready(rr, rs, a.owner, a.ttl, now, a.pv, a.budget, a.strict, out)
      if stop then  -- its record did not fit: it stays, due now (the wait counts from it)
        READY_IX.after, next_ready = {rr, rt}, nil
      end
      rr = nil
    elseif lr then
      stop = take_expired(lr, ls, a.owner, a.ttl, now, a.bound, a.budget, a.strict, out)
      if stop then LEASES_IX.after, next_lease = {lr, lt}, nil end
      lr = nil
    else
      break
    end
    if stop then break end
  end
  -- The entry each index holds after those visited (due's ix.after), for the wait: one read
  -- but not taken, or what its page says.
  if rr then READY_IX.after = {rr, rt} elseif next_ready then next_ready() end
  if lr then LEASES_IX.after = {lr, lt} elseif next_lease then next_lease() end
  if READY_IX.bad then return {CORRUPT, 'index:ready', 0, -1} end
  if LEASES_IX.bad then return {CORRUPT, 'index:leases', 0, -1} end
  local bad_write = commit()
  if bad_write then return {CORRUPT, bad_write, 0, -1} end
  rates_send()
  local wait = -1
  if ready then wait = wait_after_claim(WAKE_READY, READY_IX, #out, more_pending) end
  if leases then
    local lease_wait = wait_after_claim(WAKE_LEASES, LEASES_IX, #out, false)
    -- A session's runs are due at its expiry: the first one's counts as a lease's.
    local _, at = SESSION.head()
    if at then
      local session_wait = at <= now_ms() and 0 or math.ceil(at) - now_ms()
      if lease_wait < 0 or session_wait < lease_wait then lease_wait = session_wait end
    end
    if wait < 0 or (lease_wait >= 0 and lease_wait < wait) then wait = lease_wait end
  end
  return {OK, out, DROPPED, wait}
end

-- A script of two operations: the first's arguments at ARGV[3 .. ARGV[2] + 2] (its own
-- ARGV[2..]), then the claim's kind and its arguments (run_claim's ARGV[2..]). Both sets are
-- checked first; then the first runs and, when it answers OK, the claim, on what the first
-- left: {first's reply, claim's reply}. A first that answers anything else ends the script
-- ({first's reply, false}, the claim not run: the caller sends it alone), and so does a
-- first that did the most a call may (wrote a record over MAX_FUSED_RECORD, or re-indexed
-- runs waiting on its run): each part stays within the server's stall bound, the two
-- together might not.
local function two_ops(first_args, first)
  local n = arg_int(2, 1, #ARGV - 3)
  local kind = ARGV[n + 3]
  if kind ~= 'ready' and kind ~= 'leases' and kind ~= 'any' then
    error('BADARG ARGV[' .. (n + 3) .. '] must be a claim kind: ready, leases or any')
  end
  ARGS = {ARGV[1], unpack(ARGV, 3, n + 2)}
  local a = first_args()
  ARGS = {ARGV[1], unpack(ARGV, n + 4)}
  local b = claim_args()
  local r = first(a)
  if r[1] ~= OK or FANNED > 0 or (a.record and #a.record > MAX_FUSED_RECORD) then
    return {r, false}
  end
  -- What the first put into an index is in it now: the claim reads it there.
  DROPPED, READY_IX.low, LEASES_IX.low = 0, nil, nil
  return {r, op_claim(kind, b)}
end
