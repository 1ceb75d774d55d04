-- lean_one.lua: the fast paths of the single-run operations (get, renew, release, insert),
-- as lean.lua's are written (read its top comment): straight-line code over lean_meta and
-- lean_run, one function a script, no table per run. Each takes the common case only,
-- checks for it everything the general code checks (more strictly where that is simpler),
-- writes the bytes the general code would, and answers nil, before it has written
-- anything, for every other case: the script then falls through to its general code.
-- tests/lua/test_fast_paths.py runs histories both ways and compares every reply and key.
--
-- Where a fast path writes an index it did not read, it asks the key's type first (ZCARD:
-- one bounded read, an error for another type), and its first write is one the server
-- refuses under maxmemory (ZADD, SET, SETRANGE), sent as a pcall: refused, nothing is
-- written, and the general code meets the same refusal (commit.lua's rule).

-- run_get's fast path: a run stored as lean_run takes it, read in a namespace of one
-- partition at layout 5; its reply as run_get's general code answers it (current()'s
-- shape: leases.lua). Not taken: a missing run, a damaged or quarantined one, a record over
-- the ceiling (lean_run refuses them all: the general code answers each).
local function lean_get()
  local run = ARGV[2]
  if not run or run == '' or #run > MAX_TEXT or not lean_meta() then return nil end
  local k = P .. RUN_KEY .. run
  local len, _, tail, rev, exp, tok, cdr, cat, _, _, _, _, _, _, tk, at, nb, _, own, ck =
    lean_run(k)
  if not len then return nil end
  -- record_of()'s read: from the tail when it holds the whole value.
  local rec = ''
  if len > 0 then
    if tail then
      rec = str_sub(tail, 1, len)
    else
      rec = redis.call('GETRANGE', k, '0', int(len - 1))
    end
  end
  -- holder(): a lease is live while its expiry is after now (the clock read only then).
  local held = own ~= ''
  local live = held and tonumber(exp) > now_ms() and 1 or 0
  return {OK, {tonumber(rev), rec, held and own, live, cat ~= '' and ck, cdr,
    cat ~= '' and tonumber(cat), tonumber(tk) or 0, held and (tonumber(tok) or 0),
    tonumber(at) or 0, nb ~= '' and tonumber(nb), ''}, 0, -1}
end

-- run_renew's fast path: every listed run (distinct, 1 to MAX_RENEW) stored as lean_run
-- takes it; those owner holds live renewed to now + ttl, the others passed over as the
-- general code passes them; a ttl of at least WAKE_AHEAD (no wake-up signal). Reads
-- everything first, then one ZADD of the leases index (its type checked by the ZADD
-- itself, the first write) and one SETRANGE of each renewed header, in place (save()'s:
-- padded where it shrank, its trailer where it grew). Not taken: a run it does not read
-- (missing, damaged, quarantined).
local function lean_renew()
  local owner, ttl, n = ARGV[2], decimal(ARGV[3], WAKE_AHEAD, MAX_TTL), #ARGV - 3
  if not owner or owner == '' or #owner > MAX_TEXT or not ttl or n < 1 or n > MAX_RENEW
      or not lean_meta() then
    return nil
  end
  local now = now_ms()
  local exps, olen = int(now + ttl), int(#owner)
  local add, out, keys, offsets, heads = {'ZADD', LEASES}, {}, {}, {}, {}
  local seen = n > 1 and {}
  for i = 4, n + 3 do
    local run = ARGV[i]
    if run == '' or #run > MAX_TEXT then return nil end
    if seen then
      if seen[run] then return nil end
      seen[run] = true
    end
    local k = P .. RUN_KEY .. run
    local len, region, _, rev, exp, tok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, lw,
      own, ck, wa = lean_run(k)
    if not len then return nil end
    if own == owner and tonumber(exp) > now then
      -- header()'s: the fields as stored (lean_run's, counts of 0 as none), the new expiry.
      local h = rev .. ',' .. exps .. ',' .. tok .. ',' .. cdr .. ',' .. cat .. ',' .. wk
        .. ',' .. wn .. ',' .. wdl .. ',' .. wrev .. ',' .. wpv .. ',' .. pt .. ',' .. tk
        .. ',' .. at .. ',' .. nb .. ',,,' .. olen .. ',' .. (ck == '' and '0' or int(#ck))
        .. ',' .. lw .. ':' .. owner .. ck .. wa
      if #h <= region then
        h = h .. string.rep(' ', region - #h)
      else
        h = h .. trailer(#h)
      end
      local m = #out + 1
      out[m], keys[m], offsets[m], heads[m] = run, k, int(len), h
      add[2 * m + 1], add[2 * m + 2] = exps, run
    end
  end
  -- None renewed: nothing to write, but the general code answers a leases index of another
  -- type (asked: ZCARD). Else the ZADD, the first write, checks it.
  if #out == 0 then
    if type(redis.pcall('ZCARD', LEASES)) ~= 'number' then return nil end
    return {OK, out, 0, -1}
  end
  if type(redis.pcall(unpack(add))) == 'table' then return nil end
  for m = 1, #keys do redis.call('SETRANGE', keys[m], offsets[m], heads[m]) end
  return {OK, out, 0, -1}
end

-- run_release's fast path: every listed run (distinct, 1 to MAX_RENEW) stored as lean_run
-- takes it, with no wait or an At wait; those owner holds freed (finish_run's without a
-- failure: no lease, no claim info, the rest as it was), the others passed over. A freed
-- run whose At wait is current enters the ready index at its due time (eligible_at's: the
-- earlier of due and deadline, not before its back-off): due now with a wake-up token
-- (add_tokens, as the general code sends it), or due WAKE_AHEAD ms ahead or more with
-- none. Not taken: a run it does not read, a Changed or Poll wait, a due time in between
-- (its signal reads the index's head).
local function lean_release()
  local owner, pvs, n = ARGV[2], ARGV[3], #ARGV - 3
  local pv = decimal(pvs, 0, 2147483648)
  if not owner or owner == '' or #owner > MAX_TEXT or not pv or n < 1 or n > MAX_RENEW
      or not lean_meta() then
    return nil
  end
  local rem, out, keys, offsets, heads = {'ZREM', LEASES}, {}, {}, {}, {}
  local add, tokens, now = false, false, false
  local seen = n > 1 and {}
  for i = 4, n + 3 do
    local run = ARGV[i]
    if run == '' or #run > MAX_TEXT then return nil end
    if seen then
      if seen[run] then return nil end
      seen[run] = true
    end
    local k = P .. RUN_KEY .. run
    local len, region, _, rev, _, tok, _, _, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, lw, own, _,
      wa = lean_run(k)
    if not len then return nil end
    if own == owner then
      if wk ~= '' and wk ~= 'a' then return nil end
      if wk == 'a' and wrev == rev and (wpv == pvs or tonumber(wpv) >= pv) then
        local t, ts = tonumber(wn), wn
        if wdl ~= '' and tonumber(wdl) < t then t, ts = tonumber(wdl), wdl end
        if nb ~= '' and tonumber(nb) > t then t, ts = tonumber(nb), nb end
        now = now or now_ms()
        if t <= now then
          tokens = tokens or {}
          tokens[#tokens + 1] = wake_token(run)
        elseif t - now < WAKE_AHEAD then
          return nil
        end
        add = add or {'ZADD', READY}
        add[#add + 1], add[#add + 2] = ts, run
      end
      local h = rev .. ',,' .. tok .. ',,,' .. wk .. ',' .. wn .. ',' .. wdl .. ',' .. wrev
        .. ',' .. wpv .. ',' .. pt .. ',' .. tk .. ',' .. at .. ',' .. nb .. ',,,0,0,' .. lw
        .. ':' .. wa
      if #h <= region then
        h = h .. string.rep(' ', region - #h)
      else
        h = h .. trailer(#h)
      end
      local m = #out + 1
      out[m], keys[m], offsets[m], heads[m] = run, k, int(len), h
      rem[m + 2] = run
    end
  end
  -- Nothing to free: the general code writes nothing either, whatever the indexes' types.
  if #out == 0 then return {OK, out, 0, -1} end
  -- The leases index's type, asked; the first write a pcall: the ready entries (the ready
  -- index's type checked by them), else the first header.
  if type(redis.pcall('ZCARD', LEASES)) ~= 'number' then return nil end
  local first = 1
  if add then
    if type(redis.pcall(unpack(add))) == 'table' then return nil end
  else
    if type(redis.pcall('SETRANGE', keys[1], offsets[1], heads[1])) == 'table' then
      return nil
    end
    first = 2
  end
  redis.call(unpack(rem))
  for m = first, #keys do redis.call('SETRANGE', keys[m], offsets[m], heads[m]) end
  if tokens then add_tokens(WAKE_READY, tokens) end
  return {OK, out, 0, -1}
end

-- run_insert's fast path: a new run (no key, no waiters of it) under Release() or
-- Claim(owner, ttl) with a ttl of at least WAKE_AHEAD, with no wait or an At wait, no
-- watch of another partition; at revision deleted-rev + 1, its first grant deleted-tok + 1
-- (deleted_floor()'s: each field sized, then read, then checked). A free run's current At
-- wait puts it in the ready index at its due time (the earlier of due and deadline): due
-- now with a wake-up token, WAKE_AHEAD ms ahead or more with none. Its writes: the index
-- entry (the first write, a pcall: the index's type and the memory limit checked by it),
-- then the run's value (put_run()'s: one SET up to 8 KiB of record). Not taken: any other
-- lease or wait, an existing run, a damaged floor, a due time in between.
local function lean_insert()
  local run, record, kind, owner, wk, pvs = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[7],
    ARGV[11]
  -- ARGV[11] there: so is every argument before it (ARGV has no holes).
  if not decimal(pvs, 0, 2147483648) or ARGV[12] or run == '' or #run > MAX_TEXT
      or #record > MAX_RECORD_CEILING then
    return nil
  end
  local ttl = kind == 'c' and decimal(ARGV[6], WAKE_AHEAD, MAX_TTL)
  if (kind ~= 'r' and not (ttl and owner ~= '' and #owner <= MAX_TEXT))
      or (wk ~= '' and wk ~= 'a') then
    return nil
  end
  -- The wait's fields as header() writes them, and when it is eligible (t, ts as text).
  local waits, t, ts = ',,,', false, false
  if wk == 'a' then
    local wn, wdl = ARGV[9], ARGV[10]
    t, ts = decimal(wn, 0, MAX_INT), wn
    local deadline = wdl == '' or decimal(wdl, 0, MAX_INT)
    if not t or not deadline then return nil end
    if deadline ~= true and deadline < t then t, ts = deadline, wdl end
    waits = wn .. ',' .. wdl .. ','
  end
  if not lean_meta() then return nil end
  local k = P .. RUN_KEY .. run
  if redis.call('EXISTS', k, P .. DEPS_KEY .. run) ~= 0 then return nil end
  if redis.call('HSTRLEN', META, 'deleted-rev') > 16
      or redis.call('HSTRLEN', META, 'deleted-tok') > 16 then
    return nil
  end
  local floor = redis.call('HMGET', META, 'deleted-rev', 'deleted-tok')
  local dt = floor[2] or '0'
  local rev, tok = decimal(floor[1] or '0', 0, MAX_INT - 2), decimal(dt, 0, MAX_INT - 2)
  if not rev or not tok then return nil end
  local revs = int(rev + 1)
  if wk == 'a' then waits = waits .. revs .. ',' .. pvs end
  -- header()'s: the new run's fields, then where it is indexed (ix, at score).
  local h, ix, score, wake
  if kind == 'c' then
    score = int(now_ms() + ttl)
    h = revs .. ',' .. score .. ',' .. int(tok + 1) .. ',,,' .. wk .. ',' .. waits
      .. ',,,,,,,' .. int(#owner) .. ',0,0:' .. owner
    ix = LEASES
  else
    h = revs .. ',,' .. (tok > 0 and dt or '') .. ',,,' .. wk .. ',' .. waits
      .. ',,,,,,,0,0,0:'
    if t then
      local now = now_ms()
      if t > now and t - now < WAKE_AHEAD then return nil end
      ix, score, wake = READY, ts, t <= now
    end
  end
  local value = record
  if #record <= 8192 then value = record .. h .. trailer(#h) end
  if ix then
    if type(redis.pcall('ZADD', ix, score, run)) == 'table' then return nil end
    redis.call('SET', k, value)
  elseif redis.pcall('SET', k, value).err then  -- (its answer a table, {ok = 'OK'})
    return nil
  end
  if #record > 8192 then redis.call('SETRANGE', k, int(#record), h .. trailer(#h)) end
  if wake then add_tokens(WAKE_READY, {wake_token(run)}) end
  return {OK, rev + 1, 0, -1}
end
