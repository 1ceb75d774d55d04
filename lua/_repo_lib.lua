-- _repo_lib.lua: shared fragments of the instance repository's scripts. redisstore.core.scripts
-- sends each repo_*.lua with the fragments of this file that it uses (a fragment is one
-- top-level `local` definition, up to the next one); the run store's scripts use _lib.lua.
-- The build is the run store's (lua/_lib.lua's header, redisstore/core/scripts.py): a script's
-- header ends with `--- @include name, ...` naming every fragment of this file its body
-- uses, and loading fails, with file:line, when header and body disagree.
--
-- Rules every repository script follows (the run store's, lua/_lib.lua):
--   Check, then write. A script does every read and every validation first and only
--   queues its writes (later); commit() sends them at the very end. Redis never rolls a
--   failed script back, so a script that returns an error or a refusal has written
--   nothing, and a runaway script stays killable (SCRIPT KILL works until the first write).
--   Trust nothing. Every ARGV number and every stored number must be a canonical decimal
--   integer in range (tonumber alone takes '0x10', ' 5 ', '1e3', 'nan'). A bad ARGV raises
--   an error whose text starts "BADARG" before anything is written; a record whose stored
--   data fails answers CORRUPT with the field; an index key of the wrong type answers
--   CORRUPT 'index:<name>'. An index entry that leads to no claimable record is never
--   listed (listings are reads: they skip, they do not repair).
--   Bounded work. A listing visits at most MAX_PAGE index entries; a save evicts at most
--   MAX_EVICT terminal records (the rest go on later terminal saves). docs/repository.md
--   gives the measured per-item costs behind both.
--   ARGV[1] is the namespace's key prefix "{ns}:" (one hash tag: one cluster slot), so a
--   script can name the keys it only learns about while it runs (a record's old group
--   index, an evicted record).
--
-- Replies: {code, payload, dropped, next_due}, the run store's shape and codes
-- (redisstore.core.scripts.Code, which the build writes in as one generated line): OK 0, NOT_FOUND 1 (payload false: no record; 'group': the
-- group is not registered), CONFLICT 3 (payload: stored version), CORRUPT 7 (payload: the
-- field), TOO_NEW 8 (payload: the stored layout), PARTITIONED 10 (payload: the namespace's
-- partition count: see spread). No repository script quarantines or schedules anything:
-- dropped is 0 and next_due -1.
--
-- Datetimes are integer microseconds since the Unix epoch, passed and stored as decimal
-- text: a Lua double is exact only up to 2^53 (about 285 years around 1970), so the
-- scripts compare them as text (int_le), never as numbers.
--
-- Per-instance hash P.."inst:"..id:
--   v   rec_version          pl  payload bytes           g   group        t  tenant
--   x   lease expiry (µs, '' none)   xo  its UTC offset (µs)   o  lease owner   n  incarnation
--   s   status           k   its class: 'c' claimable once expired, 's' suspended, 't' terminal
-- Indexes: P.."inflight:"..group (zset id -> lease expiry µs, '-inf' without one; only
-- records of class 'c'), P.."terminal" (zset id -> sequence of the transition to terminal,
-- from the counter P.."terminal-seq"), P.."groups" (set).
-- The key names are defined once, in redisstore/core/keys.py (REPOSITORY_KEYS, REPOSITORY_PARTS):
-- the build writes each as a lib name ahead of this file's (GROUPS = P .. 'groups',
-- INST_KEY = 'inst:'). Never define or spell one here: use its name.

-- Caps (docs/repository.md gives the measured per-item costs; redisstore.repository has
-- the same numbers and checks them first, these hold for anyone with EVALSHA).
local MAX_PAGE = 1000

local MAX_EVICT = 50

local MAX_PAYLOAD = 2097152

-- rec_version and terminal sequence numbers stay exact in a Lua double.
local MAX_VERSION = 9007199254740991

-- The lease expiries a timezone-aware Python datetime can have (year 1 at UTC+23:59:59.999999
-- to year 9999 at UTC-23:59:59.999999), as text: beyond 2^53 only text compares exactly.
local MIN_US, MAX_US = '-62135683199999999', '253402387199999998'

-- A UTC offset is strictly within a day (datetime.timezone's own bound).
local MAX_OFFSET = 86399999999

local MIN_INT64, MAX_INT64 = '-9223372036854775808', '9223372036854775807'

local function now_us()
  local t = redis.call('TIME')
  return int(tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

local function inst_key(id)
  return P .. INST_KEY .. id
end

local function inflight_key(group)
  return P .. INFLIGHT_KEY .. group
end

-- a <= b for two canonical signed decimal texts, exact at any size: as numbers while both
-- are below 2^53 (today's times are), else as text, nine digits at a time (Lua's own
-- string < follows the server's locale).
local function int_le(a, b)
  local x, y = tonumber(a), tonumber(b)
  if x > -9007199254740992 and x < 9007199254740992 and y > -9007199254740992
      and y < 9007199254740992 then
    return x <= y
  end
  local na, nb = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if na ~= nb then return na end
  if na then a, b = string.sub(b, 2), string.sub(a, 2) end
  if #a ~= #b then return #a < #b end
  for i = 1, #a, 9 do
    x, y = tonumber(string.sub(a, i, i + 8)), tonumber(string.sub(b, i, i + 8))
    if x ~= y then return x < y end
  end
  return true
end

-- s when it is a canonical signed decimal integer text ('0', '42', '-7'; not '-0', '007',
-- '+1', ' 5', '1e3', '0x10') of at most 19 digits within [lo, hi] (texts), else nil.
local function signed(s, lo, hi)
  if type(s) ~= 'string' then return nil end
  local body = s
  if string.sub(s, 1, 1) == '-' then
    body = string.sub(s, 2)
    if body == '0' then return nil end
  end
  if #body == 0 or #body > 19 then return nil end
  if body ~= '0' and not string.find(body, '^[1-9]%d*$') then return nil end
  if not (int_le(lo, s) and int_le(s, hi)) then return nil end
  return s
end

-- A lease expiry as stored: '' (none) or microseconds within the datetime range.
local function expiry_ok(s)
  return s == '' or signed(s, MIN_US, MAX_US) ~= nil
end

local function offset_ok(s)
  return signed(s, int(-MAX_OFFSET), int(MAX_OFFSET)) ~= nil
end

local function incarnation_ok(s)
  return signed(s, MIN_INT64, MAX_INT64) ~= nil
end

-- The class a status is indexed by, as redisstore.repository.record_class says.
local function class_of(status)
  if status == 'completed' or status == 'terminated' then return 't' end
  if status == 'suspended' then return 's' end
  return 'c'
end

local function arg_text(i)
  local s = ARGV[i]
  if s == nil or s == '' then error('BADARG ARGV[' .. i .. '] must be non-empty') end
  return s
end

local function arg_any(i)
  if ARGV[i] == nil then error('BADARG ARGV[' .. i .. '] is missing') end
  return ARGV[i]
end

-- A declared key must be the one the script would name itself, or a caller could make it
-- write one key and index another.
local function arg_key(i, want)
  if KEYS[i] ~= want then error('BADARG KEYS[' .. i .. '] must be ' .. want) end
  return want
end

-- The key's type ('none', 'hash', 'zset', 'set', 'string'...).
local function key_type(key)
  local t = redis.call('TYPE', key)
  return t.ok or t
end

-- Whether key is absent or of the given type.
local function of_type(key, kind)
  local t = key_type(key)
  return t == 'none' or t == kind
end

-- Queue a write ahead of every other. Under maxmemory Redis refuses a script's first write
-- (OOM) only if that write can grow memory (DEL, ZREM cannot), and then lets every later
-- write through: a save queues its record first, so its evictions never open the way past
-- the limit.
local function first(...)
  table.insert(WRITES, 1, {...})
end

local function commit()
  touch_writes()
  for i = 1, #WRITES do redis.call(unpack(WRITES[i])) end
end

local function reply(code, payload)
  return {code, payload, 0, -1}
end

-- A number kept in a string key: the number, nil when the key is absent, or false when it
-- holds another type or anything but a decimal in [lo, hi] (any error but a type error
-- aborts the script: nothing written). The length is asked first: a value longer than any
-- decimal (16 digits: decimal) is false unread, so a planted 8 MB value costs one STRLEN.
local function stored_int(key, lo, hi)
  local len = redis.pcall('STRLEN', key)
  if type(len) == 'table' then
    wrong_type(len)
    return false
  end
  if len > 16 then return false end
  local got = redis.pcall('GET', key)
  if type(got) == 'table' then
    wrong_type(got)
    return false
  end
  if not got then return nil end
  return decimal(got, lo, hi) or false
end

-- A repository spread over partitions (redisstore.partitioned_repository) keeps their count
-- in the namespace's own key {ns}:repo-partitions (repo_partitions; the run store's count
-- is apart) and its records in the partitions' keys ({ns#p}:): a repository of one
-- partition, whose prefix is {ns}:, must neither read nor write beside them; a count there
-- is never 1. Each partition records the count too, in its own P.."repo-partitions", which
-- a partition's script compares with the caller's (ARGV[1] after P: "6", "6+" or "*", as
-- the run store's check_layout does): another is PARTITIONED (0 while a repartition is
-- under way, 1 once back to one partition); none, to a caller that has not checked the
-- namespace's count, UNCOUNTED, and for "6+" a write records it. The refusal, or nil.
local function spread()
  local count = string.sub(ARGV[1], #P + 1)
  if string.find(P, '#', 1, true) then
    if count == '*' or count == '' then return nil end
    local want, record = string.match(count, '^([1-9]%d?%d?)(%+?)$')
    if not want then error("BADARG ARGV[1] must end with the repository's partition count") end
    local n = stored_int(REPO_PARTITIONS, 0, MAX_PARTITIONS)
    if n == false then return reply(CORRUPT, 'repo-partitions') end
    if n == nil then
      if record == '' then return reply(UNCOUNTED, 0) end
      later('SET', REPO_PARTITIONS, want, 'NX')
      return nil
    end
    if int(n) ~= want then return reply(PARTITIONED, n) end
    return nil
  end
  if count ~= '' then error('BADARG ARGV[1] must be a key prefix {namespace}:') end
  local n = stored_int(REPO_PARTITIONS, 2, MAX_PARTITIONS)
  if n == false then return reply(CORRUPT, 'repo-partitions') end
  if n then return reply(PARTITIONED, n) end
  return nil
end

-- A sorted-set score as a number (servers spell them differently: '2.534023008e+17',
-- '253402300800000000', 'inf').
local function score(s)
  if s == 'inf' or s == '+inf' then return math.huge end
  if s == '-inf' then return -math.huge end
  return tonumber(s)
end

-- One canonical text per score, which the server parses back to the same double: the
-- cursor of a listing carries it.
local function score_text(n)
  if n == math.huge then return 'inf' end
  if n == -math.huge then return '-inf' end
  if n == math.floor(n) and math.abs(n) < 9.2e18 then return int(n) end
  return string.format('%.17g', n)
end

-- Whether a sorts strictly before b in the order Redis gives members of equal score
-- (bytes, then length), with a bisection for the common prefix: each step is one C
-- comparison, so a long id costs O(log length) steps.
local function before(a, b)
  local n = math.min(#a, #b)
  local lo, hi = 0, n
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if string.sub(a, 1, mid) == string.sub(b, 1, mid) then lo = mid else hi = mid - 1 end
  end
  if lo == n then return #a < #b end
  return string.byte(a, lo + 1) < string.byte(b, lo + 1)
end

-- The rank just past (sc, id) in the zset key: the first entry a listing has not visited.
-- The entry itself is usually still there (one ZRANK); when it moved or went, the count
-- below its score plus a bisection among the members of equal score (bounded: at most
-- ~log2(N) ZRANGE calls of one member).
local function rank_after(key, sc, id)
  local at = redis.call('ZSCORE', key, id)
  if at and score(at) == score(sc) then return redis.call('ZRANK', key, id) + 1 end
  local below = redis.call('ZCOUNT', key, '-inf', '(' .. sc)
  local lo, hi = 0, redis.call('ZCOUNT', key, sc, sc)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', key, below + mid, below + mid)[1]
    if before(id, m) then hi = mid else lo = mid + 1 end
  end
  return below + lo
end

-- One stored record's fields checked: the record as a table, nil when absent, or false
-- and the field that fails. fields is the list of names read (v always first).
local function load_record(k, fields)
  local v = redis.pcall('HMGET', k, unpack(fields))
  if v.err then return false, wrong_type(v) end
  local r = {}
  for i = 1, #fields do r[fields[i]] = v[i] end
  if not r.v then
    if redis.call('EXISTS', k) == 1 then return false, 'v' end
    return nil
  end
  r.v = decimal(r.v, 1, MAX_VERSION)
  if not r.v then return false, 'v' end
  if r.pl == false then return false, 'pl' end
  if r.g ~= nil and (not r.g or r.g == '') then return false, 'g' end
  if r.t == false then return false, 't' end
  if r.x ~= nil and not (r.x and expiry_ok(r.x)) then return false, 'x' end
  if r.xo ~= nil and not (r.xo and offset_ok(r.xo)) then return false, 'xo' end
  if r.o == false then return false, 'o' end
  if r.n ~= nil and not (r.n and incarnation_ok(r.n)) then return false, 'n' end
  if r.s ~= nil and (not r.s or r.s == '') then return false, 's' end
  if r.k ~= nil then
    if r.k ~= 'c' and r.k ~= 's' and r.k ~= 't' then return false, 'k' end
    if r.s and r.k ~= class_of(r.s) then return false, 'k' end
  end
  return r
end
