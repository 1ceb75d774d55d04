-- layout.lua: the namespace's layout and partition count, checked once per script.

-- Whether the meta key records layout 5 (read_layout): a write records it where it does
-- not (commit).
local RECORDED = false

-- read_layout: these scripts read layout 5 only. A namespace that records it (meta v5,
-- asked with HEXISTS: nothing is read whole) goes on: at once for a namespace of one
-- partition, after the count check for a partition; one that records an older layout, or
-- whose index keys hold entries though it records none (written before layouts were
-- recorded), is TOO_OLD (migrate() moves it); a newer one TOO_NEW; none at all, a new
-- namespace, at layout 5 from its first write. In a partition, compare the count the caller
-- was opened with (ARGV[1] after P) with the one the partition records (meta partitions):
-- another is PARTITIONED (0 while a repartition is under way, 1 once the namespace went
-- back to one partition); none, for a caller that has not checked the namespace's own count,
-- is UNCOUNTED (it checks, then calls again), and for one that has ('6+') a write records
-- it (queued: a script that writes nothing records nothing). Each field is sized before it
-- is read.
local function read_layout()
  local v = redis.pcall('HEXISTS', META, 'v5')
  if type(v) == 'table' then
    wrong_type(v)  -- not a type error (a key the ACL denies...): raised, not corrupt
    return {CORRUPT, 'meta', 0, -1}
  end
  if v == 1 and ARGV[1] == P and not PARTITION then
    -- v5 in the namespace's own meta: layout 5, one partition (a repartition over more
    -- takes v5 away before it records the count): one bounded read decides.
    RECORDED = true
    return nil
  end
  local n = redis.call('HSTRLEN', META, 'partitions')
  if n > 16 then return {CORRUPT, 'meta.partitions', 0, -1} end
  local parts = n > 0 and redis.call('HGET', META, 'partitions')
  local count = string.sub(ARGV[1], #META - 3)  -- what follows P
  if PARTITION then
    if count ~= '*' and count ~= '' then
      local want, record = string.match(count, '^([1-9]%d?%d?)(%+?)$')
      if not want then error("BADARG ARGV[1] must end with the store's partition count") end
      if parts then
        if parts ~= want then
          local got = decimal(parts, 0, MAX_PARTITIONS)
          if got == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
          return {PARTITIONED, got, 0, -1}
        end
      elseif record == '' then
        return {UNCOUNTED, 0, 0, -1}
      else
        later('HSETNX', META, 'partitions', want)
      end
    end
  elseif count ~= '' then
    error('BADARG ARGV[1] must be a key prefix {namespace}:')
  elseif parts then
    -- The namespace is spread over partitions, whose keys are {ns#p}: this store of one
    -- (prefix {ns}:) must not write beside them. A count is never 1 (one partition
    -- records none).
    local got = decimal(parts, 2, MAX_PARTITIONS)
    if got == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
    return {PARTITIONED, got, 0, -1}
  end
  if v == 1 then
    RECORDED = true
    return nil
  end
  -- A namespace with a change feed records no v5 (so the fast paths, which read only v5,
  -- leave it to this code): its bounds (feed.lua).
  if redis.call('HSTRLEN', META, 'feed') <= 40 then
    local f = redis.call('HGET', META, 'feed')
    if f then feed_config(f) end
  end
  n = redis.call('HSTRLEN', META, 'layout')
  if n > 16 then return {CORRUPT, 'meta.layout', 0, -1} end
  if n > 0 then
    local layout = decimal(redis.call('HGET', META, 'layout'), 1, 1000000)
    if layout == nil then return {CORRUPT, 'meta.layout', 0, -1} end
    if layout > LAYOUT then return {TOO_NEW, layout, 0, -1} end
    if layout < LAYOUT then return {TOO_OLD, layout, 0, -1} end
    return nil
  end
  -- None recorded: a new namespace, unless the index keys hold entries (a namespace of
  -- layout 1 written before layouts were recorded, or whose meta key was deleted).
  if not PARTITION and redis.call('EXISTS', LEASES, READY) > 0 then return {TOO_OLD, 1, 0, -1} end
  return nil
end

-- The layout check's answer, once per script.
local LAYOUT_CHECKED = false

local function check_layout()
  if not LAYOUT_CHECKED then LAYOUT_CHECKED = {read_layout()} end
  return LAYOUT_CHECKED[1]
end
