-- lean.lua: the fast paths of the claims (the writes': lean_write.lua), straight-line
-- with few functions: Lua makes every function a script defines
-- again on each call, which is most of what the general code costs. A fast path takes only
-- the common case, checks for it everything the general code checks (and more strictly),
-- and writes exactly the bytes the general code would; anything else it hands, before it
-- has written anything, to the general code (it answers nil: the script falls through to
-- its slow path). tests/lua/test_fast_paths.py runs histories both ways and compares every
-- reply and every key.

-- Whether the namespace is at layout 5, of one partition, as its meta records.
local function lean_meta()
  return ARGV[1] == P and not PARTITION and redis.pcall('HEXISTS', META, 'v5') == 1
end

-- Session sid's expiry and owner, read as SESSION.of reads its record (sized first, each
-- field checked); nil for an absent or damaged one, which the general code answers. Not
-- SESSION.of itself: the SESSION table's functions would be made on every call of every
-- fast path.
local function lean_session(sid)
  local n = redis.pcall('HSTRLEN', SESSIONS, sid)
  if type(n) ~= 'number' or n == 0 or n > MAX_TEXT + 64 then return nil end
  local exp, ttl, cur, own = string.match(redis.call('HGET', SESSIONS, sid),
    '^(%d+),(%d+),(%d*),(.+)$')
  exp = exp and decimal(exp, 0, MAX_INT)
  if not exp or not decimal(ttl, 1, MAX_TTL) or #cur > 20 then return nil end
  return exp, own
end

-- A claim's arguments at ARGV[b..b+7] (run_claim's ARGV[2..9]) when each is what the fast
-- path takes, as claim_args reads them; else nil (the general code checks them again). A
-- claim while a session is due (its runs are the general code's to put into LEASES) is
-- the general code's. f: a fused finish's plan (lean_write's), whose session record, read
-- in this script, a claim under the same session takes as it is.
local function lean_claim_args(b, f)
  -- The first session due (nil: none): a lapsed one's runs are for the general code to put
  -- into LEASES; a live one's expiry counts in the leases index's wait.
  local h = redis.pcall('ZRANGE', SESSION_LEASES, 0, 0, 'WITHSCORES')
  if h.err then return nil end
  local shead = h[2] and tonumber(h[2])
  if shead and shead > MAX_INT then shead = nil end
  if shead and shead <= now_ms() then return nil end
  local owner, bound, strict = ARGV[b], ARGV[b + 5] or '', ARGV[b + 6] or ''
  local sid, sn = ARGV[b + 7] or '', false
  if sid ~= '' then
    -- A session's claim: its session live, of owner (else the general code refuses it).
    if #sid > 20 or not str_find(sid, '^[1-9]%d*$') then return nil end
    local own
    if f and f.sid == sid then
      sn, own = f.sexp, f.sown
    else
      sn, own = lean_session(sid)
    end
    if not sn or own ~= owner or sn <= now_ms() then return nil end
  end
  local a = {owner = owner, ttl = decimal(ARGV[b + 1], 1, MAX_TTL),
             limit = decimal(ARGV[b + 2], 0, MAX_CLAIM), pv = decimal(ARGV[b + 3], 0, 2147483648),
             budget = decimal(ARGV[b + 4], 0, MAX_CLAIM_BYTES),
             bound = bound ~= '' and decimal(bound, 0, MAX_TAKEOVERS),
             strict = strict == '1' and 1 or 0, olen = false, pvs = ARGV[b + 3],
             sid = sn and sid, sexp = sn, shead = shead}
  if not owner or owner == '' or #owner > MAX_TEXT or not a.ttl or not a.limit or not a.pv
      or not a.budget or a.bound == nil or (strict ~= '' and strict ~= '1') then
    return nil
  end
  a.olen = int(#owner)
  return a
end

-- A run of the ready index or the leases index, as a claim's fast path takes it: key k
-- read, its header taken whole by HEADER, each field held as it is stored (text), and
-- checked as codec.lua's stored() checks it, by shape rather than one by one: no number of
-- 16 digits or more (so each is below 2^53) and none with a leading zero; the fields the
-- claim writes or decides by, read as numbers. Answers the run's fields, as values (a
-- table of them cost the server more than reading them): len, region, tail (the value when
-- it is shorter than TAIL, else false), rev, exp, tok, cdr, cat, wk, wn, wdl, wrev, wpv,
-- pt, tk, at, nb, lw (texts; tk, at and tok '' for 0), own, ck, wa, lo, lc, sid (text, ''
-- none); nil for anything stored() would refuse, or a run the caller would not take as it
-- is (quarantined; a session's, unless sessions: the caller reads the session itself): the
-- general code's.
local function lean_run(k, sessions)
  local tail = redis.pcall('GETRANGE', k, TAIL_FROM, '-1')
  if type(tail) ~= 'string' then return nil end
  local n = #tail
  local d = n > 1 and str_byte(tail, n) - 48
  if not d or d < 1 or d > 6 or d + 1 > n then return nil end
  local size = decimal(str_sub(tail, n - d, n - 1), 1, MAX_HEADER)
  if not size then return nil end
  local total = n
  if n == TAIL then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  if len < 0 or len > MAX_RECORD_CEILING then return nil end
  local h
  if size + d + 1 <= n then h = str_sub(tail, n - size - d, n - d - 1)
  else h = redis.call('GETRANGE', k, int(len), int(len + size - 1)) end
  local rev, exp, tok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, px, sid, lo, lc, lw,
    pos = string.match(h, HEADER)
  -- No number of 16 digits or more (each field's length: a search of the header for 16
  -- digits tried the pattern at every byte, a tenth of a claim's cost), none with a leading
  -- zero (rev's first byte; the others follow a comma).
  if not pos or px ~= '' or (sid ~= '' and (not sessions or #sid > 15 or sid == '0'))
      or str_byte(h) == 48 or #rev > 15 or #exp > 15
      or #tok > 15 or #cdr > 15 or #cat > 15 or #wn > 15 or #wdl > 15 or #wrev > 15
      or #wpv > 15 or #pt > 15 or #tk > 15 or #at > 15 or #nb > 15 or #lo > 15 or #lc > 15
      or #lw > 15 then
    return nil
  end
  local zero = str_find(h, ',0%d')
  if zero and zero < pos then return nil end
  -- (Most texts are empty: '0' is a pointer comparison, tonumber a float parse.)
  local nlo = lo == '0' and 0 or tonumber(lo)
  local nlc, nlw = lc == '0' and 0 or tonumber(lc), lw == '0' and 0 or tonumber(lw)
  local rest = pos + nlo + nlc + nlw
  if rest - 1 > size or (rest <= size and not str_find(h, '^ *$', rest)) then return nil end
  -- stored()'s rules of shape: a lease has an expiry, claim info its time, a wait its
  -- fields (an At no key, the others one), counts within their bound.
  if (nlo > 0) == (exp == '') or (cat == '' and (nlc > 0 or cdr ~= ''))
      or (wk == '' and (nlw > 0 or wn ~= '' or wdl ~= '' or wrev ~= '' or wpv ~= ''))
      or (wk ~= '' and (wrev == '' or wpv == '' or (wk == 'a') ~= (nlw == 0)
                        or (wk ~= 'c' and wn == '') or (wk == 'p' and wn == '0')))
      or (pt ~= '' and wk ~= 'p')
      or (#tk >= 10 and tonumber(tk) > MAX_TAKEOVERS)
      or (#at >= 10 and tonumber(at) > MAX_TAKEOVERS) then
    return nil
  end
  -- header() writes a count of 0 as none.
  if tk == '0' then tk = '' end
  if at == '0' then at = '' end
  if tok == '0' then tok = '' end
  if sid ~= '' and nlo == 0 then return nil end  -- a session's run is held
  return len, size, n < TAIL and tail, rev, exp, tok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk,
    at, nb, lw, str_sub(h, pos, pos + nlo - 1), str_sub(h, pos + nlo, pos + nlo + nlc - 1),
    str_sub(h, pos + nlo + nlc, rest - 1), lo, lc, sid
end

-- An index's wait (ms) from backend time t, the due time of its first entry not taken (nil:
-- none), or low, what this script put in, when earlier: 0 when due, -1 when neither.
local function lean_due(t, low, now)
  if low and (not t or low < t) then t = low end
  if not t then return -1 end
  if t <= now then return 0 end
  if t > MAX_INT then return -1 end  -- a score no run has (inf): wait_after_claim's -1
  return math.ceil(t) - now
end

-- The leases index's wait after a claim (wait_after_claim's), from its page (a ZRANGE
-- WITHSCORES of size entries) where the claim stopped (at): its first entry not taken
-- (read ahead; a page that ended there leaves it unknown: nil, the general code's), skip's
-- passed over (a finish before freed it), or low.
local function lean_wait(page, at, low, skip, size, now)
  if skip and page[at] == skip then at = at + 2 end
  if not page[at] and #page == 2 * size then return nil end
  return lean_due(tonumber(page[at + 1]), low, now)
end

-- The ready index's wait after a claim, from its page of due entries (ids) where the claim
-- stopped (at): due when one is left there; else its first entry not due (asked, at the
-- rank after the page's: the page holds every due one). skip there is stale: nil, the
-- general code's.
local function lean_ready_wait(page, at, low, skip, now)
  local t = page[at] and now
  if page[at] == skip and skip then return nil end
  if not t then
    local after = redis.call('ZRANGE', READY, int(#page), int(#page), 'WITHSCORES')
    if skip and after[1] == skip then return nil end
    t = tonumber(after[2])
  end
  return lean_due(t, low, now)
end

-- The plan of a claim (kind 'ready', 'leases' or 'any'; arguments a as claim_args reads
-- them) that the fast path takes: every entry it visits due now, of a run the general code
-- would take as it is (a free At run eligible now, or an expired lease that is not poison
-- and no poison bound stops), in due order, ties by run id; no re-indexing pending; its
-- lease at least WAKE_AHEAD ms (no wake-up signal of it). Reads only: its runs, the writes
-- that take them (their keys, where each header goes and the header, header()'s: the
-- fields as stored but the ones the claim changes: the lease, its token, claim info (a
-- ready claim's own; none passed from another owner), the counts of an expired lease (a
-- lost try; from another owner a takeover)), the replies and the wait of each index; nil
-- for the general code. After a finish of the same script (the layout checked then):
-- skip, the run it frees, whose entries the pages still show, and ready_at, where it
-- enters READY (due later than WAKE_AHEAD). Every number it writes is text already or
-- formatted by int(): `..` of a number formats a float, several times dearer.
local function lean_claim(kind, a, skip, ready_at)
  if a.ttl < WAKE_AHEAD or (not skip and not lean_meta()) then return nil end
  local ready, leases = kind ~= 'leases', kind ~= 'ready'
  if ready and redis.call('EXISTS', FANOUT) == 1 then return nil end
  local now = now_ms()
  -- A session's claim: each run's header holds the session's expiry and id (no lease entry
  -- of its own: lean_take adds it to the session's set).
  local exp = a.sid and a.sexp or now + a.ttl
  local exps, nows = int(exp), int(now)
  local sids = a.sid or ''
  -- Each index's head: in the ready index its entries due now, ids only (each score read
  -- costs the server a float's formatting), one ahead of the limit; in the leases one
  -- with their scores, one ahead and one more for skip's (a stale skip among the ready
  -- ones is the general code's).
  local rsize, lsize = a.limit + 1, a.limit + (skip and 2 or 1)
  local rp, lp = {}, {}
  if ready then
    rp = redis.pcall('ZRANGE', READY, '-inf', nows, 'BYSCORE', 'LIMIT', '0', int(rsize))
  end
  if leases then lp = redis.pcall('ZRANGE', LEASES, '0', int(lsize - 1), 'WITHSCORES') end
  if rp.err or lp.err then return nil end
  local owner, olen = a.owner, a.olen
  local plan = {runs = {}, runs_r = {}, keys = {}, offsets = {}, heads = {}, out = {},
                exps = exps, nows = nows, ready_wait = -1, leases_wait = -1, sids = {}}
  local i, j, spent, taken = 1, 1, 0, 0
  local strict = a.strict
  while taken < a.limit do
    if skip and rp[i] == skip then return nil end  -- a stale entry: the general code's
    if skip and lp[j] == skip then j = j + 2 end  -- the finish took it out
    local rr, lr, lt = rp[i], lp[j], tonumber(lp[j + 1])
    if lr and lt > now then lr = nil end
    local run, from
    if rr and lr then
      -- Both due (rare): the earlier first, ties by run id (the ready one's score asked).
      local rt = tonumber(redis.call('ZSCORE', READY, rr))
      from = rt < lt or (rt == lt and bytes_before(rr, lr))
    else
      from = rr ~= nil
    end
    if from then
      run, i = rr, i + 1
    elseif lr then
      run, j = lr, j + 2
    else
      break
    end
    local k = P .. RUN_KEY .. run
    local len, region, tail, rev, rexp, tok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, nb,
      lw, own, ck, wa, _, _, rsid = lean_run(k, not from)
    if not len then return nil end
    if from then
      -- Free, an At wait of this revision, eligible now: the general code's take_ready.
      if own ~= '' or wk ~= 'a' or wrev ~= rev
          or (wpv ~= a.pvs and tonumber(wpv) < a.pv) then
        return nil
      end
      local t = tonumber(wn)
      if wdl ~= '' and tonumber(wdl) < t then t = tonumber(wdl) end
      if nb ~= '' and tonumber(nb) > t then t = tonumber(nb) end
      if t > now then return nil end
    elseif own == '' or (rsid == '' and tonumber(rexp) > now)
        or (own ~= owner and a.bound and (tk == '' and 0 or tonumber(tk)) >= a.bound) then
      return nil
    elseif rsid ~= '' then
      -- A run of a lapsed session, swept into LEASES (due at the session's expiry): taken
      -- as an expired lease when the session's record says it lapsed and is the run
      -- owner's, its set a set (anything else is the general code's); its lease is the
      -- session's, whatever its header's expiry says. lean_take takes it out of the set,
      -- and the session with its last run.
      local left = plan.left and plan.left[rsid]
      if not left then
        local sexp, sown = lean_session(rsid)
        local t = sexp and sexp <= now and sown == own
          and redis.call('TYPE', P .. SESSION_RUNS .. rsid)
        if not t or (type(t) == 'table' and t.ok or t) ~= 'set' then return nil end
        left = {}
        plan.left = plan.left or {}
        plan.left[rsid] = left
        plan.sids[#plan.sids + 1] = rsid
      end
      left[#left + 1] = run
    end
    local rec
    if a.budget > 0 then
      if taken + strict > 0 and spent + len > a.budget then
        -- It stays, due now: the entry the wait counts from.
        if from then i = i - 1 else j = j - 2 end
        break
      end
      spent = spent + len
      if len == 0 then
        rec = ''
      elseif tail then
        rec = str_sub(tail, 1, len)
      else
        rec = redis.call('GETRANGE', k, '0', int(len - 1))
      end
    end
    -- The claim's fields (header()'s) and the run's new header.
    local ckl = '0'
    if from then
      ck, cdr, cat = '', '', nows
    else
      if own ~= owner then
        ck, cdr, cat = '', '', ''
        tk = tk == '' and '1' or int(math.min(tonumber(tk) + 1, MAX_TAKEOVERS))
      elseif ck ~= '' then
        ckl = int(#ck)
      end
      at = at == '' and '1' or int(math.min(tonumber(at) + 1, MAX_TAKEOVERS))
    end
    tok = tok == '' and 1 or tonumber(tok) + 1
    local h = rev .. ',' .. exps .. ',' .. int(tok) .. ',' .. cdr .. ',' .. cat .. ',' .. wk
      .. ',' .. wn .. ',' .. wdl .. ',' .. wrev .. ',' .. wpv .. ',' .. pt .. ',' .. tk .. ','
      .. at .. ',' .. nb .. ',,' .. sids .. ',' .. olen .. ',' .. ckl .. ',' .. lw .. ':' .. owner
      .. ck .. wa
    if #h <= region then
      h = h .. string.rep(' ', region - #h)
    else
      h = h .. trailer(#h)
    end
    taken = taken + 1
    plan.runs[taken], plan.runs_r[taken] = run, from
    plan.keys[taken], plan.offsets[taken], plan.heads[taken] = k, int(len), h
    if rec then
      -- current()'s shape: a live lease of owner.
      plan.out[taken] = {run, {tonumber(rev), rec, owner, 1, cat ~= '' and ck, cdr,
        cat ~= '' and tonumber(cat), tonumber(tk) or 0, tok, tonumber(at) or 0,
        nb ~= '' and tonumber(nb), '', a.sid or false}}
    else
      plan.out[taken] = run
    end
  end
  if ready then
    plan.ready_wait = lean_ready_wait(rp, i, ready_at, skip, now)
    if not plan.ready_wait then return nil end
  end
  if leases then
    -- A session's claim adds no lease entry (its runs are due with the session's head).
    plan.leases_wait = lean_wait(lp, j, taken > 0 and not a.sid and exp, skip, lsize, now)
    if not plan.leases_wait then return nil end
  end
  return plan
end

-- Tell wake key key an index's wait w after the claim of plan (wait_after_claim's): no
-- entry left, its tokens go; work left now, one token stays for the next claimer. The
-- claim's wait so far, with w.
local function lean_wake(key, w, plan, wait)
  if w < 0 then
    redis.pcall('ZREMRANGEBYRANK', key, '0', '-1')
  elseif w == 0 and #plan.runs > 0 then
    redis.pcall('ZADD', key, 'NX', plan.nows, '~more')
  end
  if wait < 0 or (w >= 0 and w < wait) then return w end
  return wait
end

-- Take the runs of plan (lean_claim's) for a.owner: their headers, their index entries,
-- the wake keys told as wait_after_claim tells them. The claim's reply; nil when its first
-- write was refused (nothing written: the general code's turn). written: the script wrote
-- already (its keys' types were read).
local function lean_take(kind, a, plan, written)
  local runs = plan.runs
  if #runs > 0 then
    -- Their lease entries, or under a session its set (and out of LEASES, an expired
    -- lease taken); out of READY, a ready run taken.
    local add, rem, lrem = {'ZADD', LEASES}, {'ZREM', READY}, {'ZREM', LEASES}
    if a.sid then add = {'SADD', P .. SESSION_RUNS .. a.sid} end
    for n, run in ipairs(runs) do
      if a.sid then
        add[n + 2] = run
        if not plan.runs_r[n] then lrem[#lrem + 1] = run end
      else
        add[2 * n + 1], add[2 * n + 2] = plan.exps, run
      end
      if plan.runs_r[n] then rem[#rem + 1] = run end
    end
    -- The first write (unless the script wrote before: written): a key of another type
    -- refuses it, nothing written (the general code then answers CORRUPT); so does a
    -- server under maxmemory.
    local added = (written and redis.call or redis.pcall)(unpack(add))
    if type(added) == 'table' then return nil end
    if #rem > 2 then redis.call(unpack(rem)) end
    if #lrem > 2 then redis.call(unpack(lrem)) end
    local offsets, heads = plan.offsets, plan.heads
    for n, k in ipairs(plan.keys) do redis.call('SETRANGE', k, offsets[n], heads[n]) end
    -- Runs of lapsed sessions leave their sets; a lapsed session left without runs is
    -- gone (SESSION.leave's end of a session).
    for _, sid in ipairs(plan.sids) do
      local set = P .. SESSION_RUNS .. sid
      redis.call('SREM', set, unpack(plan.left[sid]))
      if redis.call('SCARD', set) == 0 then
        redis.call('HDEL', SESSIONS, sid)
        redis.call('ZREM', SESSION_LEASES, sid)
        redis.call('DEL', P .. SESSION_TOLD .. sid)
      end
    end
  end
  local wait = -1
  if kind ~= 'leases' then wait = lean_wake(WAKE_READY, plan.ready_wait, plan, wait) end
  if kind ~= 'ready' then
    wait = lean_wake(WAKE_LEASES, plan.leases_wait, plan, wait)
    -- A live session's runs are due at its expiry: the first one's counts as a lease's.
    local at = a.shead
    if at then
      local now = now_ms()
      local w = at <= now and 0 or math.ceil(at) - now
      if wait < 0 or w < wait then wait = w end
    end
  end
  return {OK, plan.out, 0, wait}
end
