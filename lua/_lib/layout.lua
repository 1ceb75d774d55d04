-- layout.lua: the namespace's layout and partition count, checked once per script.

-- read_layout: refuse a namespace laid out by a newer library; a damaged meta key is corrupt. In a
-- partition, compare the count the caller was opened with (ARGV[1] after P) with the one the
-- partition records (meta partitions): another is PARTITIONED (0 while a repartition is
-- under way, 1 once the namespace went back to one partition); none, for a caller that has
-- not checked the namespace's own count, is UNCOUNTED (it checks, then calls again), and
-- for one that has ('6+') a write records it (queued: a script that writes nothing records
-- nothing). Each field is bounded before it is read whole.
-- Whether the meta key records the namespace's layout (read_layout): a write records it
-- where it does not (commit), which a fast path, writing without commit, leaves to SLOW.
local RECORDED = false

local function read_layout()
  local size = redis.pcall('HSTRLEN', META, 'layout')
  if type(size) == 'table' then
    wrong_type(size)  -- not a type error (a key the ACL denies...): raised, not corrupt
    return {CORRUPT, 'meta', 0, -1}
  end
  if size > 16 then return {CORRUPT, 'meta.layout', 0, -1} end
  if redis.call('HSTRLEN', META, 'old-ix') > 16 then return {CORRUPT, 'meta.old-ix', 0, -1} end
  if redis.call('HSTRLEN', META, 'partitions') > 16 then
    return {CORRUPT, 'meta.partitions', 0, -1}
  end
  local got = redis.call('HMGET', META, 'layout', 'old-ix', 'partitions')
  local count = string.sub(ARGV[1], #META - 3)  -- what follows P
  if PARTITION then
    if count ~= '*' and count ~= '' then
      local want, record = string.match(count, '^([1-9]%d?%d?)(%+?)$')
      if not want then error("BADARG ARGV[1] must end with the store's partition count") end
      if got[3] then
        if got[3] ~= want then
          local n = decimal(got[3], 0, MAX_PARTITIONS)
          if n == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
          return {PARTITIONED, n, 0, -1}
        end
      elseif record == '' then
        return {UNCOUNTED, 0, 0, -1}
      else
        later('HSETNX', META, 'partitions', want)
      end
    end
  elseif count ~= '' then
    error('BADARG ARGV[1] must be a key prefix {namespace}:')
  elseif got[3] then
    -- The namespace is spread over partitions, whose keys are {ns#p}: this store of one
    -- (prefix {ns}:) must not write beside them. A count is never 1 (one partition
    -- records none).
    local n = decimal(got[3], 2, MAX_PARTITIONS)
    if n == nil then return {CORRUPT, 'meta.partitions', 0, -1} end
    return {PARTITIONED, n, 0, -1}
  end
  if not got[1] then
    -- None recorded: a new namespace, at layout 4 (every write records it), unless the
    -- index keys of layouts 1 to 3 hold entries: one written before layouts were recorded,
    -- or whose meta key was deleted, read as layout 1 (migrate() then moves it) rather than
    -- as 4, which would not see its leases and ready runs.
    if not PARTITION and redis.call('EXISTS', LEASES, READY) > 0 then NS = 1 end
    return nil
  end
  local n = decimal(got[1], 1, 1000000)
  if n == nil then return {CORRUPT, 'meta.layout', 0, -1} end
  if n > LAYOUT then return {TOO_NEW, n, 0, -1} end
  if got[2] and got[2] ~= '1' then return {CORRUPT, 'meta.old-ix', 0, -1} end
  NS, OLD_IX, RECORDED = n, n >= 4 and got[2] == '1', true
  return nil
end

-- The layout check's answer, once per script (a fast path's, the slow path's again).
local LAYOUT_CHECKED = false

local function check_layout()
  if not LAYOUT_CHECKED then LAYOUT_CHECKED = {read_layout()} end
  return LAYOUT_CHECKED[1]
end
