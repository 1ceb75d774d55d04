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
-- straight-line code, two small functions, one table; any other case, before anything is
-- written, takes the slow path.
--- @include CORRUPT, MAX_RECORD_CEILING, MAX_TEXT, OK, P, META, RUN_KEY, arg_text
--- @include LEASES_BUCKETS, DEPS_BUCKETS, DEPS_SEP, BUCKET_DIR, BUCKET_AT, arg_int
--- @include arg_wait, lease_refusal, commit, check_layout, write, PARTITION, TAIL
--- @include arg_lease, MAX_INT, load_at, rewatch
local find, sub, byte = string.find, string.sub, string.byte
-- Whether x is a canonical decimal of at most 15 digits (so below MAX_INT - 1).
local function dec(x)
  return x == '0' or (#x <= 15 and find(x, '^[1-9]%d*$') ~= nil)
end
-- The field of header h at pos (text: "n:bytes" or empty) as stored, '' when empty, and
-- where the next one starts; nil at the header's end; nil, nil when malformed.
local function field(h, pos, text)
  local c = byte(h, pos)
  if c == nil or c == 32 then return nil, pos end
  local e
  if text and c ~= 44 then
    local digits = string.match(h, '^(%d+):', pos)
    if not digits or not dec(digits) then return nil, nil end
    e = pos + #digits + 1 + tonumber(digits)
    if byte(h, e) ~= 44 then return nil, nil end
  else
    e = find(h, ',', pos, true)
    if not e then return nil, nil end
  end
  return sub(h, pos, e - 1), e + 1
end
local run, expected, record, kind, wk2 = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[8]
if ARGV[13] or not ARGV[12] or ARGV[1] ~= P or PARTITION or run == '' or #run > MAX_TEXT
    or #record > MAX_RECORD_CEILING or expected == '0' or not dec(expected)
    or not dec(ARGV[12]) or tonumber(ARGV[12]) > 2147483648 then
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
  if (wk2 == 'a' and not dec(wn2)) or (wk2 ~= 'a' and (wa2 == '' or #wa2 > MAX_TEXT))
      or (wk2 == 'c' and wn2 ~= '' and not dec(wn2))
      or (wk2 == 'p' and (wn2 == '0' or not dec(wn2)))
      or (wk2 ~= 'a' and wk2 ~= 'c' and wk2 ~= 'p') or (wdl2 ~= '' and not dec(wdl2)) then
    return SLOW()
  end
  wa2 = #wa2 .. ':' .. wa2
end
-- The layout: 4 recorded, no migration, no partition count (each field bounded first).
local size = redis.pcall('HSTRLEN', META, 'layout')
if size ~= 1 or redis.call('HSTRLEN', META, 'old-ix') ~= 0
    or redis.call('HSTRLEN', META, 'partitions') ~= 0 then
  return SLOW()
end
local meta = redis.call('HMGET', META, 'layout', 'old-ix', 'partitions')
if meta[1] ~= '4' or meta[2] or meta[3] then return SLOW() end
-- The run's header, read from its last TAIL bytes (stored_v2's reading).
local k = P .. RUN_KEY .. run
local tail = redis.pcall('GETRANGE', k, -TAIL, -1)
if type(tail) ~= 'string' or tail == '' then return SLOW() end
local n = #tail
local d = byte(tail, n) - 48
if d < 1 or d > 6 then return SLOW() end
size = sub(tail, n - d, n - 1)
if not dec(size) or size == '0' then return SLOW() end
size = tonumber(size)
if size + d + 1 > n then return SLOW() end
local len = n
if n == TAIL then len = redis.call('STRLEN', k) end
len = len - size - d - 1
if len < 0 then return SLOW() end
local h = sub(tail, n - size - d, n - d - 1)
-- Its fields: the revision expected, then each as stored.
local p = #expected + 2
if sub(h, 1, p - 1) ~= expected .. ',' then return SLOW() end
local own, exp, ck, cdr, cat, wk, wa, wn, wdl, wrev, wpv, pk, pt, tk, px, rt
own, p = field(h, p, true)
if p then exp, p = field(h, p) end
if p then ck, p = field(h, p, true) end
if p then cdr, p = field(h, p) end
if p then cat, p = field(h, p) end
if p and cat then
  wk, p = field(h, p)
  if p then wa, p = field(h, p, true) end
  if p then wn, p = field(h, p) end
  if p then wdl, p = field(h, p) end
  if p then wrev, p = field(h, p) end
  if p then wpv, p = field(h, p) end
  if p then pk, p = field(h, p, true) end
  if p then pt, p = field(h, p) end
  if p then tk, p = field(h, p) end
  if p then px, p = field(h, p) end
  if p then rt, p = field(h, p) end
end
if not p or (p <= #h and not find(h, '^ *$', p)) then return SLOW() end
-- Checked as load checks them, more strictly: anything else is the slow path's.
own, exp, ck, cdr, cat = own or '', exp or '', ck or '', cdr or '', cat or ''
wk, wa, wn, wdl, wrev, wpv = wk or '', wa or '', wn or '', wdl or '', wrev or '', wpv or ''
pk, pt = pk or '', pt or ''
if own == '0:' or (own == '') ~= (exp == '') or (exp ~= '' and not dec(exp))
    or (cat == '' and (ck ~= '' or cdr ~= '')) or (cat ~= '' and not dec(cat))
    or (cdr ~= '' and not dec(cdr)) or (px or '') ~= '' or (rt or '') ~= ''
    or (tk and tk ~= '' and (not dec(tk) or tonumber(tk) > 2147483648)) then
  return SLOW()
end
if wk == '' then
  if wa ~= '' or wn ~= '' or wdl ~= '' or wrev ~= '' or wpv ~= '' or pk ~= '' or pt ~= '' then
    return SLOW()
  end
elseif (wk ~= 'a' and (wa == '' or wa == '0:')) or (wk == 'a' and wa ~= '')
    or (wk == 'c' and wn ~= '' and not dec(wn)) or (wk == 'p' and (wn == '0' or not dec(wn)))
    or (wk == 'a' and not dec(wn)) or (wk ~= 'a' and wk ~= 'c' and wk ~= 'p')
    or (wdl ~= '' and not dec(wdl)) or not dec(wrev) or not dec(wpv) or pk == '0:'
    or (pt ~= '' and not dec(pt)) then
  return SLOW()
end
-- Hold: by its holder. Release: of a run held, or without a wait (one that is neither may
-- have a ready entry to take out). Both: the same dependency (or none), no waiters.
if (kind == 'h' and own ~= owner) or (own == '' and wk ~= '') or ((wk == 'c' and wa) or false) ~= ((wk2 == 'c' and wa2) or false) then
  return SLOW()
end
local base = P .. DEPS_BUCKETS .. #run .. DEPS_SEP .. run
if redis.call('EXISTS', base .. BUCKET_AT, base .. BUCKET_DIR) > 0 then return SLOW() end
-- A Release of a held run: its lease entry, in the bucket of its composite.
local dir, bucket, card
if kind == 'r' and own ~= '' then
  dir = P .. LEASES_BUCKETS .. BUCKET_DIR
  local bounds = redis.pcall('ZREVRANGEBYLEX', dir,
    '[' .. string.rep('0', 16 - #exp) .. exp .. run, '-', 'LIMIT', 0, 1)
  if bounds.err then return SLOW() end
  bucket = bounds[1] or ''
  card = redis.pcall('ZCARD', P .. LEASES_BUCKETS .. BUCKET_AT .. bucket)
  if type(card) ~= 'number' then return SLOW() end
  own, exp, ck, cdr, cat = '', '', '', '', ''
end
-- The new header, as header() writes it: tk 0, px and rt none.
local rev = string.format('%d', tonumber(expected) + 1)
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
n = #f
while n > 1 and f[n] == '' do n = n - 1 end
h = table.concat(f, ',', 1, n) .. ','
local digits = #h .. ''
if #record <= 8192 then
  redis.call('SET', k, record .. h .. digits .. #digits)
else
  redis.call('SET', k, record)
  redis.call('SETRANGE', k, #record, h .. digits .. #digits)
end
if dir then
  local key = P .. LEASES_BUCKETS .. BUCKET_AT .. bucket
  if card - redis.call('ZREM', key, run) <= 0 and bucket ~= '' then
    redis.call('ZREM', dir, bucket)
  end
end
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
