-- index.lua: the run indexes (one sorted set or set each) and the changes a script queues
-- to them.

-- A run index: key (a sorted set run -> score, or a set of waiters), its type, name in a
-- CORRUPT reply ('index:' .. name) and label in the quarantine.
local function index(key, kind, name, label)
  return {key = key, kind = kind, name = name, label = label, scored = kind == 'zset'}
end

local LEASES_IX = index(LEASES, 'zset', 'leases', 'leases')

local READY_IX = index(READY, 'zset', 'ready', 'ready')

local DEPS_IX = {}

-- The index of the runs waiting for dep to change.
local function deps_ix(dep)
  local ix = DEPS_IX[dep]
  if not ix then
    ix = index(P .. DEPS_KEY .. dep, 'set', 'd', 'd:' .. dep)
    DEPS_IX[dep] = ix
  end
  return ix
end

-- Take run out of index ix (queued). The commands are spelled out, as everywhere:
-- redisstore.security grants a confined user the commands the scripts name.
local function ix_rem(ix, run)
  if ix.scored then
    later('ZREM', ix.key, run)
  else
    later('SREM', ix.key, run)
  end
end

-- Put run in index ix at score (queued; a set's entry has none).
local function ix_add(ix, run, score)
  if ix.scored then
    later('ZADD', ix.key, int(score), run)
  else
    later('SADD', ix.key, run)
  end
end

-- Whether index ix's key is absent or of its type.
local function index_intact(ix)
  return of_type(ix.key, ix.kind)
end

-- The first entry of scored index ix (run, score), or nil (none, or a key of another type).
local function ix_head(ix)
  if not of_type(ix.key, 'zset') then return nil end
  local h = redis.call('ZRANGE', ix.key, 0, 0, 'WITHSCORES')
  return h[1], tonumber(h[2])
end
