-- commit.lua: sending the queued writes, after every check, at the end of a script.

-- The type each write command needs of its key.
local WRITE_TYPES = {ZADD = 'zset', ZREM = 'zset', SADD = 'set', SREM = 'set', HSET = 'hash',
  HDEL = 'hash', SETRANGE = 'string'}

-- The field a commit answers CORRUPT with when a key its writes name is of another type:
-- each index key is asked once, and only when the script writes it. Run keys and META were
-- read (and checked) before anything was queued.
local function writes_ok()
  local runs = P .. RUN_KEY
  for i = 1, #WRITES do
    local command, k = WRITES[i][1], WRITES[i][2]
    local kind = WRITE_TYPES[command]
    local head = string.sub(k, 1, #runs)
    if kind and k ~= META and head ~= runs and not of_type(k, kind) then
      if head == P .. DEPS_KEY or string.sub(k, 1, #P + #DEPS_BUCKETS) == P .. DEPS_BUCKETS then
        return 'index:d'
      end
      local names = {[LEASES] = 'index:leases', [READY] = 'index:ready',
        [LEASES_IX.dir] = 'index:leases', [READY_IX.dir] = 'index:ready',
        [FANOUT] = 'index:fanout', [FANOUT_CURSOR] = 'index:fanout-cursor',
        [QUARANTINE] = 'quarantine'}
      return names[k] or 'type'
    end
  end
  return nil
end

-- Commands that take many members (or fields) in one call.
local VARIADIC = {ZADD = true, ZREM = true, SADD = true, SREM = true, HSET = true, HDEL = true}

-- WRITES with each write of a variadic command joined to the key's previous write when that
-- is the same command: one call where a claim of 100 runs queued 100 ZADDs (a call costs
-- the server 1-5 us). Each key still sees its writes in the order queued (only writes to
-- other keys are passed over); at most 1,000 arguments a call.
local function coalesced()
  local out, last = {}, {}
  for i = 1, #WRITES do
    local w = WRITES[i]
    local j = last[w[2]]
    local o = j and out[j]
    if o and VARIADIC[w[1]] and o[1] == w[1] and #o + #w <= 1002 then
      for a = 3, #w do o[#o + 1] = w[a] end
    else
      out[#out + 1] = w
      last[w[2]] = #out
    end
  end
  return out
end

-- Send the queued writes, or answer the field of a key of the wrong type (nothing sent).
-- The caller returns {CORRUPT, field} for the latter.
local function commit()
  local bad, changes = ix_plan()
  if bad then return bad end
  if #WRITES == 0 and changes == 0 then return nil end
  bad = writes_ok()
  if bad then return bad end
  -- Under maxmemory Redis refuses a script's first write (OOM) only if that write is one
  -- that can grow memory (HDEL, ZREM... are not), and lets every later write through. So
  -- the first write is always such a one: it records the namespace's layout, which changes
  -- nothing but a missing meta key. check_layout ran first (NS is the namespace's).
  touch_writes()
  redis.call('HSETNX', META, 'layout', int(NS))
  local batched = coalesced()
  for i = 1, #batched do redis.call(unpack(batched[i])) end
  ix_apply()
  send_signals()
  return nil
end
