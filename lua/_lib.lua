-- _lib.lua: shared fragments, prepended to every script by redisstore.scripts.
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
-- backend time the run is eligible from, free runs with a fresh wait only), P.."d:"..dep
-- (set of runs whose wait is Changed(dep)).

local P = ARGV[1]
local LEASES = P .. 'leases'
local READY = P .. 'ready'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

-- Lease holder as the reply shape {owner|false, live 0|1}. Expiry == now is expired.
local function holder(own, exp, now)
  if not own then return false, 0 end
  if tonumber(exp) > now then return own, 1 end
  return own, 0
end

-- The lease passes to owner until exp. Claim info belongs to the previous owner's claim.
local function take(k, run, owner, exp)
  if redis.call('HGET', k, 'own') ~= owner then
    redis.call('HDEL', k, 'ck', 'cdr', 'cat')
  end
  redis.call('HSET', k, 'own', owner, 'exp', int(exp))
  redis.call('ZADD', LEASES, int(exp), run)
  redis.call('ZREM', READY, run)
end

-- Backend time from which the run at hash k is eligible for claim_ready, or nil when it is
-- not (held, no wait, stale metadata, or waiting for a dependency to change).
-- Immediate triggers (an unseen or changed dependency, a poll key seen for the first time)
-- count from now.
local function eligible_at(k, now, pv)
  local f = redis.call('HMGET', k, 'rev', 'own', 'wk', 'wa', 'wn', 'wdl', 'wrev', 'wpv', 'pt')
  local rev, own, wk, wa, wn = f[1], f[2], f[3], f[4], f[5]
  if not rev or own or not wk or f[7] ~= rev or tonumber(f[8]) < pv then return nil end
  local t = nil
  if wk == 'a' then
    t = tonumber(wn)
  elseif wk == 'p' then
    local pt = opt(f[9])
    if pt then t = pt + tonumber(wn) else t = now end
  elseif wk == 'c' then
    local seen = opt(wn)
    local drev = tonumber(redis.call('HGET', run_key(wa), 'rev') or '0')
    if seen == nil or drev ~= seen then t = now end
  end
  local deadline = opt(f[6])
  if deadline and (t == nil or deadline < t) then t = deadline end
  return t
end

-- Put run where it belongs in READY. After a dependency write (dep_write = true) a run that
-- was already eligible keeps its earlier time, so the wait is ordered by when it began.
local function reindex(k, run, now, pv, dep_write)
  local t = eligible_at(k, now, pv)
  if t == nil then
    redis.call('ZREM', READY, run)
    return
  end
  if dep_write and t == now then
    local old = redis.call('ZSCORE', READY, run)
    if old and tonumber(old) <= now then return end
  end
  redis.call('ZADD', READY, int(t), run)
end

-- Save the discovered wait (wk == '' for none), derived from revision rev at version pv.
-- A poll key's saved claim time survives while the key stays the same.
local function set_wait(k, run, wk, wa, wn, wdl, rev, pv)
  local old = redis.call('HMGET', k, 'wk', 'wa', 'pk')
  if old[1] == 'c' and (wk ~= 'c' or old[2] ~= wa) then
    redis.call('SREM', P .. 'd:' .. old[2], run)
  end
  if wk == '' then
    redis.call('HDEL', k, 'wk', 'wa', 'wn', 'wdl', 'pk', 'pt')
  else
    redis.call('HSET', k, 'wk', wk, 'wa', wa, 'wn', wn, 'wdl', wdl)
    if wk == 'c' then redis.call('SADD', P .. 'd:' .. wa, run) end
    if wk ~= 'p' then
      redis.call('HDEL', k, 'pk', 'pt')
    elseif old[3] ~= wa then
      redis.call('HSET', k, 'pk', wa)
      redis.call('HDEL', k, 'pt')
    end
  end
  redis.call('HSET', k, 'wrev', int(rev), 'wpv', int(pv))
end

-- run was written: every run waiting for it to change may now be eligible.
local function notify_dependents(run, now, pv)
  local waiters = redis.call('SMEMBERS', P .. 'd:' .. run)
  for _, w in ipairs(waiters) do
    reindex(run_key(w), w, now, pv, true)
  end
end

-- The end of every record write: wait metadata, its index, and the runs waiting on this one.
local function after_write(k, run, rev, now, wk, wa, wn, wdl, pv)
  set_wait(k, run, wk, wa, wn, wdl, rev, pv)
  reindex(k, run, now, pv, false)
  notify_dependents(run, now, pv)
end

