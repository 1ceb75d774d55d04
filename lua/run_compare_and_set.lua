-- run_compare_and_set: write revision expected + 1 under a lease condition, atomically.
-- KEYS[1]  P.."r:"..run
-- KEYS[2]  P.."leases" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[3]  P.."ready" (layout 3 index: from layout 4 not read once migrated; routes the call)
-- KEYS[4]  P.."meta"
-- ARGV[1]  key prefix           ARGV[2] run               ARGV[3] expected revision
-- ARGV[4]  record bytes
-- ARGV[5]  lease kind: 'h' Hold, 'c' Claim, 's' Seize, 'r' Release
-- ARGV[6]  owner ('' for Release)                          ARGV[7] ttl ms ('0' without one)
-- ARGV[8..11] wait: kind ('' none, 'c', 'p', 'a'), dependency/key, seen/interval/due, deadline
-- ARGV[12] projection version
-- Reply    {REWATCH, unwatched} (its dependency's watch may be undone: watch again, above
--          unwatched, and send again; nothing written) | {OK} | {NOT_FOUND} | {CONFLICT, current} | {REFUSED, {owner|false, live 0|1}}
--          | {CORRUPT, field} | {TOO_NEW, layout}; nothing written but on OK
-- Also touches, undeclared (same hash tag): P.."r:"..dep (its dependency's revision),
-- P.."d:"..dep (the waiters of its old and new dependency), P.."d:"..run and the P.."r:" of
-- those waiters (re-indexed), P.."fanout", P.."fanout-cursor", P.."quarantine",
-- P.."wake-ready" and P.."wake-leases" (signals).
-- In a partition ({ns#p}:) also P.."depv" (dependencies of other partitions), P.."watch:"..run
-- and P.."outbox" (its writes announced to the partitions waiting on it).
-- From layout 4 also the buckets and directories of the indexes it reads or changes
-- (P.."L|".., P.."L/", P.."Q|".., P.."Q/", P.."D"..#dep..":"..dep.."|".. and "/").
-- Fast path: a Hold write by the holder, or a Release without a wait, in a namespace of one
-- partition at layout 4 (as its meta records), of a run kept as a string whose header is
-- read whole from its last bytes and passes stricter checks than load's (numbers of at
-- most 15 digits...), that is not poison, not in the ready index, keeps its dependency
-- and that nothing waits on: the reads, then one SET (and the lease entry out of its
-- bucket), every byte as write() would make it. Lean on purpose (docs/design/hot-path.md):
-- straight-line code, the lib's lean readers (raw_run...), one table; any other case,
-- before anything is written, takes the slow path.
--- @include CORRUPT, MAX_RECORD_CEILING, MAX_TEXT, OK, P, RUN_KEY, arg_text, DEPS_BUCKETS
--- @include DEPS_SEP, BUCKET_DIR, BUCKET_AT, arg_int, arg_wait, lease_refusal, commit
--- @include check_layout, write, PARTITION, arg_lease, MAX_INT, dec15, raw_run, load_at
--- @include rewatch, lean_layout, lease_bucket, lease_out, put_run
local run, expected, record, kind, wk2 = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[8]
if ARGV[13] or not ARGV[12] or ARGV[1] ~= P or PARTITION or run == '' or #run > MAX_TEXT
    or #record > MAX_RECORD_CEILING or expected == '0' or not dec15(expected)
    or not dec15(ARGV[12]) or tonumber(ARGV[12]) > 2147483648 then
  return SLOW()
end
local owner, wa2, wn2, wdl2 = ARGV[6], ARGV[9], ARGV[10], ARGV[11]
if kind == 'h' then
  if owner == '' or #owner > MAX_TEXT then return SLOW() end
  owner = #owner .. ':' .. owner
elseif kind ~= 'r' or wk2 ~= '' then
  return SLOW()
end
if wk2 ~= '' then
  if (wk2 == 'a' and not dec15(wn2)) or (wk2 ~= 'a' and (wa2 == '' or #wa2 > MAX_TEXT))
      or (wk2 == 'c' and wn2 ~= '' and not dec15(wn2))
      or (wk2 == 'p' and (wn2 == '0' or not dec15(wn2)))
      or (wk2 ~= 'a' and wk2 ~= 'c' and wk2 ~= 'p') or (wdl2 ~= '' and not dec15(wdl2)) then
    return SLOW()
  end
  wa2 = #wa2 .. ':' .. wa2
end
if not lean_layout() then return SLOW() end
local k = P .. RUN_KEY .. run
local rev, own, exp, ck, cdr, cat, wk, wa, _, _, _, _, pk, pt, _, px, rt = raw_run(k)
-- At the revision expected; not poison, not in the ready index. Hold: by its holder.
-- Release: of a run held, or without a wait (one that is neither may have a ready entry
-- to take out). Both: the same dependency (or none), and no waiters to notify.
if rev ~= expected or px ~= '' or rt ~= '' or (kind == 'h' and own ~= owner)
    or (own == '' and wk ~= '') or ((wk == 'c' and wa) or false) ~= ((wk2 == 'c' and wa2) or false) then
  return SLOW()
end
local base = P .. DEPS_BUCKETS .. #run .. DEPS_SEP .. run
if redis.call('EXISTS', base .. BUCKET_AT, base .. BUCKET_DIR) > 0 then return SLOW() end
-- A Release of a held run: its lease entry, in the bucket of its composite.
local bucket, card
if kind == 'r' and own ~= '' then
  bucket, card = lease_bucket(run, exp)
  if not bucket then return SLOW() end
  own, exp, ck, cdr, cat = '', '', '', '', ''
end
-- The new header, as header() writes it: tk 0, px and rt none.
rev = string.format('%d', tonumber(expected) + 1)
if cat ~= '' and ck == '' then ck = '0:' end
local f
if wk2 == '' then
  f = {rev, own, exp, ck, cdr, cat}
else
  if wk2 ~= 'p' then
    pk, pt = '', ''
  elseif wk == '' or pk ~= wa2 then
    pk, pt = wa2, ''
  end
  if pk == '' then pt = '' end
  if wk2 == 'a' then wa2 = '' end
  f = {rev, own, exp, ck, cdr, cat, wk2, wa2, wn2, wdl2, rev, ARGV[12], pk, pt}
end
local n = #f
while n > 1 and f[n] == '' do n = n - 1 end
local h = table.concat(f, ',', 1, n) .. ','
put_run(k, record, h)
if bucket then lease_out(run, bucket, card) end
return {OK, false, 0, -1}
--- @slow
local run = arg_text(2)
local expected = arg_int(3, 0, MAX_INT - 2)
local record = ARGV[4]
if #record > MAX_RECORD_CEILING then error('BADARG the record is over ' .. MAX_RECORD_CEILING .. ' bytes') end
local kind, owner, ttl = arg_lease(5)
local w, pv = arg_wait(8)
local bad_layout = check_layout()
if bad_layout then return bad_layout end
local s, refusal = load_at(run, expected)
if not s then return refusal end
if s.rev >= MAX_INT - 1 then return {CORRUPT, 'rev', 0, -1} end
refusal = lease_refusal(s, kind, owner)
if refusal then return refusal end
local again = rewatch(w)
if again then return again end
write(run, s, s.rev + 1, record, kind, owner, ttl, w, pv)
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, false, 0, -1}
