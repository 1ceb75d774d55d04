-- commit.lua: sending the queued writes, after every check, at the end of a script.

-- The type each write command needs of its key.
local WRITE_TYPES = {ZADD = 'zset', ZREM = 'zset', SADD = 'set', SREM = 'set', HSET = 'hash',
  HDEL = 'hash', HSETNX = 'hash', SETRANGE = 'string', RPUSH = 'list', LTRIM = 'list'}

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
      if string.sub(k, 1, #P + #DEPS_KEY) == P .. DEPS_KEY then return 'index:d' end
      local names = {[LEASES] = 'index:leases', [READY] = 'index:ready',
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
  if #WRITES == 1 then return WRITES end
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

-- The write commands the server refuses, as a script's first write, under maxmemory (OOM):
-- it asks only at the first write, and lets every later write through.
local DENY_OOM = {SET = true, SETRANGE = true, ZADD = true, SADD = true, HSET = true,
  HSETNX = true}

-- Send the queued writes, or answer the field of a key of the wrong type (nothing sent).
-- The caller returns {CORRUPT, field} for the latter. The first write is one the server
-- refuses under maxmemory, so an OOM refusal comes before anything is written: the layout's
-- record, on a namespace's first write, or a mark that changes nothing.
local function commit()
  if #WRITES == 0 then return nil end
  local bad = writes_ok()
  if bad then return bad end
  if #FEED_STATE.events > 0 and not feed_ok() then return 'feed' end
  touch_writes()
  local batched = coalesced()
  if FEED_STATE.max then
    -- A namespace with a feed records no v5 (layout.lua): its writes take this code.
    if not RECORDED then redis.call('HSET', META, 'layout', LAYOUT) end
    RECORDED = true
  elseif not RECORDED then
    redis.call('HSET', META, 'layout', LAYOUT, 'v5', '1')
    RECORDED = true
  elseif not DENY_OOM[batched[1][1]] then
    redis.call('HSETNX', META, 'v5', '1')
  end
  for i = 1, #batched do redis.call(unpack(batched[i])) end
  feed_send()
  -- Sent: a second operation of the script queues afresh (ops.lua's two_ops).
  WRITES = {}
  send_signals()
  return nil
end
