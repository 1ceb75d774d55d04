-- _repo_lib.lua: shared fragments of the instance repository's scripts, prepended to each
-- by redisstore.scripts (the run store's scripts use _lib.lua instead).
--
-- Conventions for every repository script:
--   ARGV[1] is the namespace's key prefix "{ns}:" (one hash tag: one cluster slot), so a
--   script can name the keys it only learns about while it runs (a record's old group
--   index, an evicted record).
--   Replies are arrays whose first element is a status code:
--     0 ok, 1 not found, 3 concurrent update {3, stored version}, 5 unknown group,
--     6 layout too new {6, stored layout}.
--   Datetimes are integer microseconds since the Unix epoch, passed and stored as decimal
--   text: a Lua double is exact only up to 2^53 (about 285 years around 1970), so the
--   scripts never compute with them except through the server's own score parsing.
--   Other numbers written to keys go through int() so a double never reaches a key as
--   "1.7e+15".
--
-- Per-instance hash P.."inst:"..id:
--   v   rec_version          pl  payload bytes           g   group        t  tenant
--   x   lease expiry (µs, '' none)   xo  its UTC offset (µs)   o  lease owner   n  incarnation
--   s   status           k   its class: 'c' claimable once expired, 's' suspended, 't' terminal
-- Indexes: P.."inflight:"..group (zset id -> lease expiry µs, '-inf' without one; only
-- records that are neither terminal nor suspended), P.."terminal" (zset id -> sequence of
-- the transition to terminal, from the counter P.."terminal-seq"), P.."groups" (set).

local P = ARGV[1]

local function int(n)
  return string.format('%d', n)
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function inst_key(id)
  return P .. 'inst:' .. id
end

local function inflight_key(group)
  return P .. 'inflight:' .. group
end

-- a <= b for two decimal integer strings (exact at any size, unlike tonumber).
local function int_le(a, b)
  local na, nb = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if na ~= nb then return na end
  if na then a, b = string.sub(b, 2), string.sub(a, 2) end
  if #a ~= #b then return #a < #b end
  return a <= b
end
