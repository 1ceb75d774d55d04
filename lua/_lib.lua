-- _lib.lua: shared fragments. redisstore.scripts sends each script with the fragments it
-- uses (a fragment is one top-level `local` definition, up to the next one), so a script
-- pays only for what it calls.
--
-- Conventions for every script:
--   ARGV[1] is the namespace's key prefix "{ns}:" (one hash tag: one cluster slot), so a
--   script can name the per-run keys it only learns about while it runs.
--   Replies are arrays whose first element is a status code:
--     0 ok, 1 not found, 2 already exists, 3 conflict {3, current},
--     4 lease refused {4, owner|false, live 0|1}.
--   Time is read from the server (TIME) and never passed in: the server's clock judges
--   every lease and every readiness time. Numbers written to keys go through int() so that
--   a Lua double never reaches a key as "1.7e+12".
--
-- Per-run hash P.."r:"..run:
--   rec, rev            the record bytes and its revision
--   own, exp            lease owner and expiry (absent while free)
--   ck, cdr, cat        claim info of a ready claim: key ('' none), dependency revision
--                       ('' none), backend claim time; absent when there is none
--   wk, wa, wn, wdl     the discovered wait: kind ('c' Changed, 'p' Poll, 'a' At),
--                       dependency or poll key, seen / interval / due ('' none), deadline
--   wrev, wpv           revision and projection version the wait was derived from
--   pk, pt              the poll key whose last ready claim time pt is saved
-- Indexes: P.."leases" (zset run -> lease expiry, held runs only), P.."ready" (zset run ->
-- backend time the run is eligible from; free runs with a wait only), P.."d:"..dep (set of
-- runs whose wait is Changed(dep)).
--
-- A run's fields are read once into a state table s (false or nil where absent), changed
-- there, and written back with one HSET and at most one HDEL.

local P = ARGV[1]

local LEASES = P .. 'leases'

local READY = P .. 'ready'

local NOW = false

-- The server clock, read at most once per script (a call costs; many writes need no time)
-- and then the same for the whole script.
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end

local function int(n)
  return string.format('%d', n)
end

local function opt(s)
  if s == false or s == nil or s == '' then return nil end
  return tonumber(s)
end

local function run_key(run)
  return P .. 'r:' .. run
end

local FIELDS = {'rev', 'own', 'exp', 'wk', 'wa', 'wn', 'wdl', 'wrev', 'wpv', 'pk', 'pt'}

-- The run's lease and wait fields in one call.
local function load(k)
  local v = redis.call('HMGET', k, unpack(FIELDS))
  local s = {}
  for i = 1, #FIELDS do s[FIELDS[i]] = v[i] end
  return s
end

-- Lease holder as the reply shape {owner|false, live 0|1}. Expiry == now is expired.
local function holder(own, exp)
  if not own then return false, 0 end
  if tonumber(exp) > now_ms() then return own, 1 end
  return own, 0
end

-- READY may hold a run only while it is free and has a wait.
local function indexable(s)
  return (not s.own) and s.wk
end

-- Backend time from which the run in state s is eligible for claim_ready, or nil when it is
-- not (held, no wait, stale metadata, or waiting for a dependency to change). Immediate
-- triggers (an unseen or changed dependency, a poll key seen for the first time) count
-- from now.
local function eligible_at(s, pv)
  if not s.rev or s.own or not s.wk or s.wrev ~= s.rev or tonumber(s.wpv) < pv then
    return nil
  end
  local t = nil
  if s.wk == 'a' then
    t = tonumber(s.wn)
  elseif s.wk == 'p' then
    local pt = opt(s.pt)
    if pt then t = pt + tonumber(s.wn) else t = now_ms() end
  else
    local seen = opt(s.wn)
    if seen == nil or tonumber(redis.call('HGET', run_key(s.wa), 'rev') or '0') ~= seen then
      t = now_ms()
    end
  end
  local deadline = opt(s.wdl)
  if deadline and (t == nil or deadline < t) then t = deadline end
  return t
end

-- Put run where it belongs in READY after a write of its own (its time is recomputed) or of
-- its dependency (dep_write: a run already eligible keeps its earlier time, so runs are
-- ordered by when their wait became due).
local function place(run, s, was_indexed, pv, dep_write)
  local t = eligible_at(s, pv)
  if t == nil then
    if was_indexed then redis.call('ZREM', READY, run) end
    return
  end
  if dep_write and t == now_ms() then
    local old = redis.call('ZSCORE', READY, run)
    if old and tonumber(old) <= t then return end
  end
  redis.call('ZADD', READY, int(t), run)
end

-- Queue field writes: set and del are flat lists for one HSET and one HDEL.
local function flush(k, set, del)
  if #del > 0 then redis.call('HDEL', k, unpack(del)) end
  if #set > 0 then redis.call('HSET', k, unpack(set)) end
end

local function push(list, ...)
  for _, v in ipairs({...}) do list[#list + 1] = v end
end

-- The lease condition's effect on s: 'c'/'s' hand it to owner until exp, 'r' frees it,
-- 'h' leaves it. Claim info belongs to the owner whose ready claim made it.
local function apply_lease(run, s, kind, owner, ttl, set, del)
  if kind == 'c' or kind == 's' then
    local exp = now_ms() + tonumber(ttl)
    if s.own and s.own ~= owner then push(del, 'ck', 'cdr', 'cat') end
    push(set, 'own', owner, 'exp', int(exp))
    redis.call('ZADD', LEASES, int(exp), run)
    s.own, s.exp = owner, int(exp)
  elseif kind == 'r' and s.own then
    push(del, 'own', 'exp', 'ck', 'cdr', 'cat')
    redis.call('ZREM', LEASES, run)
    s.own, s.exp = false, false
  end
end

-- Save the discovered wait (wk == '' for none) as derived from s.rev at version pv. A
-- poll key's saved claim time survives while the key stays the same.
local function apply_wait(run, s, wk, wa, wn, wdl, pv, set, del)
  local was_dep = s.wk == 'c' and s.wa
  if was_dep and (wk ~= 'c' or was_dep ~= wa) then
    redis.call('SREM', P .. 'd:' .. was_dep, run)
  end
  if wk == '' then
    if s.wk then push(del, 'wk', 'wa', 'wn', 'wdl') end
    if s.pk then push(del, 'pk', 'pt') end
    s.wk, s.pk, s.pt = false, false, false
  else
    push(set, 'wk', wk, 'wa', wa, 'wn', wn, 'wdl', wdl)
    if wk == 'c' and was_dep ~= wa then redis.call('SADD', P .. 'd:' .. wa, run) end
    if wk ~= 'p' then
      if s.pk then push(del, 'pk', 'pt') end
      s.pk, s.pt = false, false
    elseif s.pk ~= wa then
      push(set, 'pk', wa)
      if s.pt then push(del, 'pt') end
      s.pk, s.pt = wa, false
    end
    s.wk, s.wa, s.wn, s.wdl = wk, wa, wn, wdl
  end
  push(set, 'wrev', s.rev, 'wpv', int(pv))
  s.wrev, s.wpv = s.rev, int(pv)
end

-- run was written: each run waiting for it to change may now be eligible.
local function notify_dependents(run, pv)
  for _, w in ipairs(redis.call('SMEMBERS', P .. 'd:' .. run)) do
    local ws = load(run_key(w))
    place(w, ws, indexable(ws), pv, true)
  end
end

-- The common end of insert and compare_and_set: lease, wait, one write, indexes.
-- A is the ARGV index of the lease kind; owner, ttl and the wait follow it.
local function write(k, run, s, rev, record, A)
  local was_indexed = indexable(s)
  local pv = tonumber(ARGV[A + 7])
  local set, del = {'rec', record, 'rev', int(rev)}, {}
  s.rev = int(rev)
  apply_lease(run, s, ARGV[A], ARGV[A + 1], ARGV[A + 2], set, del)
  apply_wait(run, s, ARGV[A + 3], ARGV[A + 4], ARGV[A + 5], ARGV[A + 6], pv, set, del)
  flush(k, set, del)
  place(run, s, was_indexed, pv, false)
  notify_dependents(run, pv)
end
