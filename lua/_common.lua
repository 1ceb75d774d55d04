-- _common.lua: fragments both libs build on (lua/_lib/ for the run store,
-- lua/_repo_lib.lua for the instance repository). redisstore.core.scripts puts this file's
-- definitions ahead of each lib's own, so a lib and its scripts use them as their own; a
-- script's header includes them like any lib name.

-- ARGV[1]: the namespace's key prefix "{ns}:", from which a script derives the keys it
-- touches beyond its KEYS. Every declared key must start with it, so a raw EVALSHA with a
-- forged prefix (another tenant's) is refused before anything is read: a script never
-- reaches keys its caller did not name the namespace of. A partition's prefix "{ns#p}:" is
-- followed by the partition count of the store that calls ("6": compare it with the count
-- the partition records; "6+": and record it where none is; "*", or nothing: a
-- repartition's own call, or one partition's operations driven alone, which compare
-- nothing): check_layout (lua/_lib.lua) and spread (lua/_repo_lib.lua) read it, as the rest
-- of ARGV[1] after P.
local P = (function()
  local a = ARGV[1]
  local c = type(a) == 'string' and string.sub(a, 1, 1) == '{' and string.find(a, '[{}]', 2)
  if not c or c < 3 or string.sub(a, c, c + 1) ~= '}:' then
    error('BADARG ARGV[1] must be a key prefix {namespace}:')
  end
  local p = string.sub(a, 1, c + 1)
  if #KEYS == 0 then error('BADARG a script needs the keys it names, from ARGV[1]') end
  for i = 1, #KEYS do
    if string.sub(KEYS[i], 1, #p) ~= p then
      error('BADARG KEYS[' .. i .. '] is not a key of the namespace of ARGV[1]')
    end
  end
  return p
end)()

local function int(n)
  return string.format('%d', n)
end

-- The arguments the argument checks read: ARGV, or in a script that runs two operations
-- (a finish and the next claim), the second one's (ARGV[1], then its own).
local ARGS = ARGV

-- A canonical decimal integer in [lo, hi] (no sign, no leading zero, at most 16 digits),
-- as a number; nil for anything else. ('0' and '1', the most common, skip the pattern and
-- tonumber: a pointer comparison each, where the two cost the server about 3,500
-- instructions.)
local function decimal(s, lo, hi)
  local n
  if s == '1' then
    n = 1
  elseif s == '0' then
    n = 0
  else
    if type(s) ~= 'string' or #s == 0 or #s > 16 or not string.find(s, '^[1-9]%d*$') then
      return nil
    end
    n = tonumber(s)
  end
  if n < lo or n > hi then return nil end
  return n
end

-- An ARGV number, or the BADARG error raised before anything is written.
local function arg_int(i, lo, hi)
  local n = decimal(ARGS[i], lo, hi)
  if n == nil then
    error('BADARG ARGV[' .. i .. '] must be an integer in [' .. int(lo) .. ', ' ..
      int(hi) .. ']')
  end
  return n
end

-- An optional ARGV flag: 1 for '1', 0 when absent or ''; BADARG for anything else.
local function arg_flag(i)
  local s = ARGS[i]
  if s == nil or s == '' then return 0 end
  if s == '1' then return 1 end
  error('BADARG ARGV[' .. i .. '] must be empty or 1')
end

-- Queued writes, sent by commit() once every check passed.
local WRITES = {}

local function later(...)
  WRITES[#WRITES + 1] = {...}
end

-- Keys this script has read already (a run it loaded, an index whose type it asked).
local READ = {}

-- Look at every key the queued writes name, before the first of them: in a cluster slot
-- that is being moved, a key already on the other node fails here (ABORTED: nothing was
-- written), never halfway through the writes. The declared KEYS need no look: the server
-- routed the call by them (ASK, TRYAGAIN) before the script ran, and nothing moves a key
-- while a script runs. Nor does a key the script read: that read would have failed.
local function touch_writes()
  local seen = {}
  for i = 1, #KEYS do seen[KEYS[i]] = true end
  for i = 1, #WRITES do
    local k = WRITES[i][2]
    if not seen[k] and not READ[k] then
      seen[k] = true
      local r = redis.pcall('EXISTS', k)
      if type(r) == 'table' then error('ABORTED ' .. tostring(r.err)) end
    end
  end
end

-- The reason for a pcall'd read that failed: 'type' for WRONGTYPE (the key is of another
-- type: the run is corrupt). Any other error (a cluster key that moved away...) aborts the
-- script: it comes before any write, so the caller is told nothing was applied.
local function wrong_type(answer)
  local err = tostring(answer.err)  -- fakeredis hands a userdata
  if string.sub(err, 1, 9) == 'WRONGTYPE' then return 'type' end
  error('ABORTED ' .. err)
end
