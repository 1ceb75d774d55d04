-- repo_delete: remove one instance record and its index entries; a no-op when absent.
-- KEYS[1]  P.."inst:"..id       KEYS[2] P.."terminal"
-- ARGV[1]  key prefix           ARGV[2] id
-- Reply    {OK, 1 deleted | 0 absent} | {CORRUPT, 'index:...'} (nothing written)
-- Also touches, undeclared (same hash tag): the record's group index, known only once read.
-- A damaged record is deleted too (delete is how an engine gets rid of one): whatever the
-- key holds goes, with the entries its group names, if it names one.
--- @include P, CORRUPT, OK, inst_key, inflight_key, arg_text, arg_key, key_type, of_type
--- @include later, commit, reply
local id = arg_text(2)
local k = arg_key(1, inst_key(id))
local terminal = arg_key(2, P .. 'terminal')
local t = key_type(k)
if t == 'none' then return reply(OK, 0) end
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
