-- args.lua: the clock, the checks of a script's ARGV, and the type of a key.

-- The server clock, read at most once per script (a call costs; many writes need no time)
-- and then the same for the whole script.
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end

local function push(list, ...)
  local n, values = #list, {...}
  for i = 1, #values do list[n + i] = values[i] end
end

local function opt_text(n)
  if n == false or n == nil then return '' end
  return int(n)
end

-- '' (none) or a decimal in [lo, hi]: false for none, nil for bad.
local function opt_decimal(s, lo, hi)
  if s == '' then return false end
  return decimal(s, lo, hi)
end

local function arg_text(i)
  local s = ARGS[i]
  if s == nil or s == '' or #s > MAX_TEXT then
    error('BADARG ARGV[' .. i .. '] must be non-empty text of at most ' .. MAX_TEXT .. ' bytes')
  end
  return s
end

-- The record bytes at ARGV[i] (empty or not), at most MAX_RECORD_CEILING of them.
local function arg_record(i)
  local s = ARGS[i]
  if s == nil or #s > MAX_RECORD_CEILING then
    error('BADARG ARGV[' .. i .. '] must be a record of at most ' .. MAX_RECORD_CEILING .. ' bytes')
  end
  return s
end

-- Key -> its type ('none', 'zset', ...), asked at most once per script (of_type).
local TYPES = {}

-- Whether key is absent or of the given type ('zset', 'set', 'hash'). An error other than
-- a type (a key a cluster slot move took) aborts: nothing is written yet.
local function of_type(key, kind)
  local t = TYPES[key]
  if t == nil then
    local r = redis.pcall('TYPE', key)
    if type(r) == 'table' and r.err then error('ABORTED ' .. tostring(r.err)) end
    t = type(r) == 'table' and r.ok or r
    TYPES[key], READ[key] = t, true
  end
  return t == 'none' or t == kind
end

-- Index entries moved to the quarantine by this script (the reply's dropped).
local DROPPED = 0

-- The wait arguments at ARGV[A..A+3] and the projection version at ARGV[A+4], checked:
-- {wk, wa, wn, wdl} with numbers as numbers (wk '' for none), and pv.
local function arg_wait(A)
  local wk, wa = ARGS[A], ARGS[A + 1]
  local w = {wk = wk, wa = wa, wn = false, wdl = false}
  if wk == 'c' then
    arg_text(A + 1)
    w.wn = opt_decimal(ARGS[A + 2], 0, MAX_INT)
  elseif wk == 'p' then
    arg_text(A + 1)
    w.wn = decimal(ARGS[A + 2], 1, MAX_INT)
  elseif wk == 'a' then
    w.wn = decimal(ARGS[A + 2], 0, MAX_INT)
  elseif wk ~= '' then
    error('BADARG ARGV[' .. A .. '] must be a wait kind: c, p, a or empty')
  end
  if wk ~= '' then
    if w.wn == nil then error('BADARG ARGV[' .. (A + 2) .. '] is not a valid number') end
    w.wdl = opt_decimal(ARGS[A + 3], 0, MAX_INT)
    if w.wdl == nil then error('BADARG ARGV[' .. (A + 3) .. '] is not a valid deadline') end
  end
  -- ARGS[A + 5..A + 7]: for a dependency in another partition, the version its watch read,
  -- that watch's number and the dependency's partition (the last two absent: unnumbered).
  w.watched = opt_decimal(ARGS[A + 5] or '', 0, MAX_INT)
  if w.watched == nil or (w.watched and (wk ~= 'c' or not PARTITION)) then
    error('BADARG ARGV[' .. (A + 5) .. '] must be empty or, for a dependency of a partition, '
      .. 'its watched version')
  end
  -- ARGS[A + 8]: '1' when the store watched again after a REWATCH (see rewatch).
  w.again = arg_flag(A + 8) == 1
  w.ws = opt_decimal(ARGS[A + 6] or '', 1, MAX_INT)
  w.wd = opt_decimal(ARGS[A + 7] or '', 0, MAX_PARTITIONS - 1)
  if w.ws == nil or w.wd == nil or (w.ws and not w.watched) or ((w.ws == false) ~= (w.wd == false)) then
    error('BADARG ARGV[' .. (A + 6) .. '..' .. (A + 7) .. '] must be empty or a watch number '
      .. 'and the partition of the watched dependency')
  end
  return w, arg_int(A + 4, 0, 2147483648)
end

-- The lease arguments at ARGS[A..A+2]: kind, owner, then the ttl ('c' Claim, 's' Seize),
-- the grant's token ('f' Fenced keeping the lease, 'F' Fenced releasing it) or the session
-- id ('j' InSession: text, checked against the session by lease_refusal).
local function arg_lease(A)
  local kind = ARGS[A]
  if kind == 'j' then
    local sid = ARGS[A + 2] or ''
    if #sid > 20 or not string.find(sid, '^[1-9]%d*$') then
      error('BADARG ARGV[' .. (A + 2) .. '] must be a session id')
    end
    return kind, arg_text(A + 1), sid
  elseif kind == 'c' or kind == 's' then
    return kind, arg_text(A + 1), arg_int(A + 2, 1, MAX_TTL)
  elseif kind == 'f' or kind == 'F' then
    return kind, arg_text(A + 1), arg_int(A + 2, 1, MAX_INT)
  elseif kind == 'h' then
    return kind, arg_text(A + 1), 0
  elseif kind == 'r' then
    return kind, '', 0
  end
  error('BADARG ARGV[' .. A .. '] must be a lease kind: h, c, s, r, f, F or j')
end
