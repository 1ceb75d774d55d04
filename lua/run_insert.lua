-- run_insert: create a run at revision 1 (one above meta's deleted-rev, the highest revision
-- a deleted run had), with a lease for Claim / Seize.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[3]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] record bytes
-- ARGV[4]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[5]  owner ('' for Release)                          ARGV[6] ttl ms ('0' without one)
-- ARGV[7..10] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[11] projection version
-- Reply    {REWATCH, unwatched} (its dependency's watch may be undone: watch again, above
--          unwatched, and send again; nothing written) | {OK, revision} | {EXISTS} | {CORRUPT, field} | {TOO_NEW, layout}; nothing written
--          but on OK
-- Also touches, undeclared (same hash tag): P.."r:"..dep (its dependency's revision),
-- P.."d:"..dep (the waiters of its dependency), P.."d:"..run and the P.."r:" of those
-- waiters (re-indexed), P.."fanout", P.."fanout-cursor", P.."quarantine", P.."wake-ready"
-- and P.."wake-leases" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
-- Fast path: a new run (no key, no waiters), in a namespace of one partition at layout 4
-- (as its meta records), with a Claim or Seize lease of at least WAKE_AHEAD ms (no wake-up
-- signal) and no wait or an At or Poll one, or free without a wait; its lease entry's
-- bucket not full: the reads, then one SET and one ZADD, every byte as write() and commit
-- make them; any other case, before anything is written, takes the slow path.
--- @include CORRUPT, EXISTS, OK, MAX_RECORD_CEILING, arg_text, commit, check_layout, load
--- @include arg_wait, arg_lease, write, deleted_rev, rewatch
--- @include P, RUN_KEY, MAX_TEXT, MAX_TTL, WAKE_AHEAD, DEPS_BUCKETS, DEPS_SEP, BUCKET_AT
--- @include BUCKET_DIR, LEASES_BUCKETS, dec15, lean_layout, lease_bucket_in, put_run
local run, record, kind, owner, ttl = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local wk, wa, wn, wdl, pv = ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]
if ARGV[12] or not pv or run == '' or #run > MAX_TEXT or #record > MAX_RECORD_CEILING
    or not dec15(pv) or tonumber(pv) > 2147483648 then
  return SLOW()
end
local held = kind == 'c' or kind == 's'
if held then
  if owner == '' or #owner > MAX_TEXT or not dec15(ttl) or tonumber(ttl) < WAKE_AHEAD
      or tonumber(ttl) > MAX_TTL then
    return SLOW()
  end
  if wk ~= '' and ((wk ~= 'a' and wk ~= 'p') or (wk == 'a' and not dec15(wn))
      or (wk == 'p' and (wa == '' or #wa > MAX_TEXT or wn == '0' or not dec15(wn)))
      or (wdl ~= '' and not dec15(wdl))) then
    return SLOW()
  end
elseif (kind ~= 'h' and kind ~= 'r') or (kind == 'h' and (owner == '' or #owner > MAX_TEXT))
    or wk ~= '' then
  return SLOW()
end
local fits, floor = lean_layout('deleted-rev')
if not fits or (floor and not dec15(floor)) then return SLOW() end
local k = P .. RUN_KEY .. run
local base = P .. DEPS_BUCKETS .. #run .. DEPS_SEP .. run
if redis.call('EXISTS', k, base .. BUCKET_AT, base .. BUCKET_DIR) > 0 then return SLOW() end
local rev = string.format('%d', tonumber(floor or '0') + 1)
local h, bound, exp = rev .. ','
if held then
  local t = redis.call('TIME')
  exp = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl))
  bound = lease_bucket_in(run, exp)
  if not bound then return SLOW() end
  h = rev .. ',' .. #owner .. ':' .. owner .. ',' .. exp .. ','
  if wk == 'a' then
    h = h .. ',,,a,,' .. wn .. ',' .. wdl .. ',' .. rev .. ',' .. pv .. ','
  elseif wk == 'p' then
    wa = #wa .. ':' .. wa
    h = h .. ',,,p,' .. wa .. ',' .. wn .. ',' .. wdl .. ',' .. rev .. ',' .. pv .. ',' .. wa .. ','
  end
end
put_run(k, record, h)
if bound then redis.call('ZADD', P .. LEASES_BUCKETS .. BUCKET_AT .. bound, exp, run) end
return {OK, tonumber(rev), 0, -1}
--- @slow
local run, record = arg_text(2), ARGV[3]
if #record > MAX_RECORD_CEILING then error('BADARG the record is over ' .. MAX_RECORD_CEILING .. ' bytes') end
local kind, owner, ttl = arg_lease(4)
local w, pv = arg_wait(7)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s = load(run)
-- A key there, even a damaged one, is never overwritten.
if s ~= nil then return {EXISTS, false, 0, -1} end
local floor = deleted_rev()
if not floor then return {CORRUPT, 'meta.deleted-rev', 0, -1} end
local again = rewatch(w)
if again then return again end
write(run, {own = false, exp = false}, floor + 1, record, kind, owner, ttl, w, pv)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, floor + 1, 0, -1}
