-- repo_save: compare-and-set of one instance record on rec_version, with its indexes.
-- KEYS[1]  P.."inst:"..id       KEYS[2] P.."groups"       KEYS[3] P.."inflight:"..group
-- KEYS[4]  P.."terminal"        KEYS[5] P.."terminal-seq"
-- ARGV[1]  key prefix           ARGV[2] id                ARGV[3] expected rec_version
-- ARGV[4]  payload bytes        ARGV[5] group             ARGV[6] tenant
-- ARGV[7]  lease expiry (µs since the epoch, '' none)      ARGV[8] its UTC offset (µs)
-- ARGV[9]  lease owner          ARGV[10] incarnation      ARGV[11] status
-- ARGV[12] max_terminal
-- ARGV[13] '' (a save), or the version of a record moved here from another partition
--          (repartition_repository): written with that version where none is stored;
--          one stored with that version already is the same move made again (OK, as is)
-- Reply    {OK, {new version, {evicted id...}}} | {CONFLICT, stored version}
--          | {NOT_FOUND, 'group'} (never registered) | {CORRUPT, field}; nothing written
--          but on OK
-- Also touches, undeclared (same hash tag): the record's previous group index when it
-- leaves it, and the hashes of the terminal records it evicts; reads
-- P.."repo-partitions" (spread: the repository's count). The class (which indexes
-- hold the record) is derived from the status here, as record_class does in Python.
--- @include CONFLICT, CORRUPT, NOT_FOUND, OK, GROUPS, TERMINAL, TERMINAL_SEQ, int, arg_int
--- @include MAX_EVICT, MAX_PAYLOAD, MAX_VERSION, MAX_US, MIN_US, later, inst_key
--- @include inflight_key, wrong_type, expiry_ok, offset_ok, incarnation_ok, class_of
--- @include arg_text, arg_any, arg_key, of_type, first, commit, reply, stored_int, spread
--- @include load_record
local id = arg_text(2)
local k = arg_key(1, inst_key(id))
local expected = arg_int(3, 0, MAX_VERSION - 1)
local payload = arg_any(4)
if #payload > MAX_PAYLOAD then error('BADARG ARGV[4] is over ' .. int(MAX_PAYLOAD) .. ' bytes') end
local group = arg_text(5)
local groups = arg_key(2, GROUPS)
local index = arg_key(3, inflight_key(group))
local terminal = arg_key(4, TERMINAL)
local seq_key = arg_key(5, TERMINAL_SEQ)
local tenant = arg_any(6)
local expiry = arg_any(7)
if not expiry_ok(expiry) then
  error('BADARG ARGV[7] must be empty or microseconds in [' .. MIN_US .. ', ' .. MAX_US .. ']')
end
local offset = arg_any(8)
if not offset_ok(offset) then error('BADARG ARGV[8] must be a UTC offset in microseconds') end
local owner = arg_any(9)
local incarnation = arg_any(10)
if not incarnation_ok(incarnation) then error('BADARG ARGV[10] must be an int64') end
local status = arg_text(11)
local max_terminal = arg_int(12, 0, MAX_VERSION)
local placed = nil
-- Below the top version: a record moved in can always be saved again.
if arg_any(13) ~= '' then placed = arg_int(13, 1, MAX_VERSION - 1) end
local class = class_of(status)
local refused = spread()
if refused then return refused end

local r, bad = load_record(k, {'v', 'g', 'k', 's'})
if r == false then return reply(CORRUPT, bad) end
local stored, old_group, was = 0, false, false
if r then stored, old_group, was = r.v, r.g, r.k end
-- Groups are never unregistered: a record already stored in this group proves it is
-- registered, so only a new record or a move to another group asks the registry. (The
-- group is still checked before the version.)
if old_group ~= group then
  local known = redis.pcall('SISMEMBER', groups, group)
  if type(known) == 'table' then
    wrong_type(known)  -- (any other error aborts: nothing written)
    return reply(CORRUPT, 'index:groups')
  end
  if known == 0 then return reply(NOT_FOUND, 'group') end
end
if placed then
  if r then
    if stored == placed then return reply(OK, {stored, {}}) end
    return reply(CONFLICT, stored)
  end
  stored = placed - 1  -- the version written is the one placed
elseif stored ~= expected then
  return reply(CONFLICT, stored)
end

-- Every index this save writes must be of its type, or the save would fail halfway.
local leaves = was == 'c' and (class ~= 'c' or old_group ~= group)
if leaves and not of_type(inflight_key(old_group), 'zset') then
  return reply(CORRUPT, 'index:inflight')
end
if class == 'c' and not of_type(index, 'zset') then return reply(CORRUPT, 'index:inflight') end
local to_terminal = class == 't' and was ~= 't'
if (to_terminal or (was == 't' and class ~= 't')) and not of_type(terminal, 'zset') then
  return reply(CORRUPT, 'index:terminal')
end

local evicted, keep, seq = {}, true, 0
if to_terminal then
  local stored_seq = stored_int(seq_key, 0, MAX_VERSION - 1)
  if stored_seq == false then return reply(CORRUPT, 'terminal-seq') end
  seq = (stored_seq or 0) + 1
  -- The count once this record joins (a stray entry of it is only re-scored).
  local count = redis.call('ZCARD', terminal)
  if not redis.call('ZSCORE', terminal, id) then count = count + 1 end
  -- At most MAX_EVICT go per save, so lowering max_terminal never stalls the server; the
  -- rest go on the next terminal saves.
  local over = math.min(count - max_terminal, MAX_EVICT)
  if over > 0 then
    for _, old in ipairs(redis.call('ZRANGE', terminal, 0, over - 1)) do
      if old ~= id then
        later('ZREM', terminal, old)
        -- Only a terminal record is deleted: an entry whose key is missing, of another
        -- type or of an active record is dropped from the index and the key left alone.
        local class_of_old = redis.pcall('HGET', inst_key(old), 'k')
        if type(class_of_old) == 'table' then wrong_type(class_of_old) end
        if class_of_old == 't' then
          later('DEL', inst_key(old))
          evicted[#evicted + 1] = old
        end
      end
    end
    -- The record itself is the newest: it goes only when every other one went first
    -- (max_terminal 0).
    keep = over < count
  end
end

if keep then
  first('HSET', k, 'v', int(stored + 1), 'pl', payload, 'g', group, 't', tenant, 'x', expiry,
        'xo', offset, 'o', owner, 'n', incarnation, 's', status, 'k', class)
elseif r then
  later('DEL', k)
end
-- Only the indexes the record enters or leaves are touched.
if leaves then later('ZREM', inflight_key(old_group), id) end
if class == 'c' then
  -- The score is the expiry text itself: the server parses it, Lua never rounds it.
  local sc = expiry
  if sc == '' then sc = '-inf' end
  later('ZADD', index, sc, id)
end
if was == 't' and class ~= 't' then later('ZREM', terminal, id) end
if to_terminal then
  -- Ordered by when the record became terminal: a later terminal save keeps its place.
  if keep then
    later('SET', seq_key, int(seq))
    later('ZADD', terminal, int(seq), id)
  else
    -- No record is written (it is evicted itself): the counter is the one write that can
    -- grow memory, so it goes first, for maxmemory to refuse the save whole (see first).
    first('SET', seq_key, int(seq))
    later('ZREM', terminal, id)
    evicted[#evicted + 1] = id
  end
end
commit()
return reply(OK, {stored + 1, evicted})
