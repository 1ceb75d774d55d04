-- repo_delete: remove one instance record and its index entries; a no-op when absent.
-- KEYS[1]  P.."inst:"..id       KEYS[2] P.."terminal"
-- ARGV[1]  key prefix           ARGV[2] id
-- ARGV[3]  expected rec_version: '' for none, else only a record at that version goes
-- Reply    {OK, 1 deleted | 0 absent} | {CONFLICT, stored version}
--          | {CORRUPT, 'index:...' or the field} (nothing written)
-- Also touches, undeclared (same hash tag): the record's group index, known only once read;
-- reads P.."repo-partitions" (spread: the repository's count).
-- A damaged record is deleted too (delete is how an engine gets rid of one): whatever the
-- key holds goes, with the entries its group names, if it names one.
--- @include CONFLICT, CORRUPT, OK, TERMINAL, decimal, MAX_VERSION, later, inst_key
--- @include inflight_key, arg_text, arg_key, key_type, of_type, commit, reply, spread
--- @include load_record
local id = arg_text(2)
local k = arg_key(1, inst_key(id))
local terminal = arg_key(2, TERMINAL)
local fence = false
if ARGV[3] ~= '' then
  fence = decimal(ARGV[3], 1, MAX_VERSION)
  if not fence then error('BADARG ARGV[3] must be empty or a rec_version') end
end
local refused = spread()
if refused then return refused end
local t = key_type(k)
if t == 'none' then return reply(OK, 0) end
if fence then
  -- A fenced delete is a compare-and-set: it needs a version it can read.
  local r, bad = load_record(k, {'v'})
  if not r then return reply(CORRUPT, bad or 'v') end
  if r.v ~= fence then return reply(CONFLICT, r.v) end
end
local group = false
if t == 'hash' then group = redis.call('HGET', k, 'g') end
if group == '' then group = false end
if group and not of_type(inflight_key(group), 'zset') then
  return reply(CORRUPT, 'index:inflight')
end
if not of_type(terminal, 'zset') then return reply(CORRUPT, 'index:terminal') end
later('DEL', k)
if group then later('ZREM', inflight_key(group), id) end
later('ZREM', terminal, id)
commit()
return reply(OK, 1)
