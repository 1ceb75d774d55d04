-- signals.lua: wake-up tokens for blocked claimers.

-- The wake token of a run: its id, or "#" and its SHA1 when the id is long (a token is
-- copied into every signal and pop).
local function wake_token(run)
  if #run <= 64 then return run end
  return '#' .. redis.sha1hex(run)
end

-- Wake-up signals, sent after the script's writes (see send_signals): per wake key, the
-- tokens to add.
local SIGNALS = {}

-- Per index (by its key), its earliest score before this script's writes, lowered by each
-- signal of an earlier time (false: empty); read at most once.
local HEADS = {}

local function queue_token(queue, key, run)
  local list = queue[key]
  if not list then
    list = {}
    queue[key] = list
  end
  list[#list + 1] = wake_token(run)
end

-- run entered index ix, claimable from backend time t: wake one blocked claimer when it is
-- claimable now, or due soon and earlier than everything the index held (claimers' timers
-- were set for a later head) or behind a head that is due now. One due WAKE_AHEAD ms or more ahead needs no signal: every
-- blocked claim claims again within its re-arm period (shorter) and learns of it then.
local function signal(key, ix, run, t)
  local now = now_ms()
  if t > now then
    if t - now >= WAKE_AHEAD then return end
    local head = HEADS[ix.key]
    if head == nil then
      local _, h = ix_head(ix)
      head = h or false
    end
    -- A head due later than now has a timer on some node (the claim that saw it set one);
    -- a head due now has none (no claim is blocked, or one is about to take it): signal.
    if head and head <= t and head > now then
      HEADS[ix.key] = head
      return
    end
    if not head or t < head then HEADS[ix.key] = t end
  end
  queue_token(SIGNALS, key, run)
end

-- Send the queued signals. They are advice: each command is a pcall, so a wake key of
-- another type (a foreign write), a full one (MAX_WAKE tokens) or a refused write (OOM)
-- only skips the signal; the data the script wrote stands, and blocked claimers find the
-- work at their re-arm.
-- Add tokens to wake key key, as advice (pcalls), up to MAX_WAKE in all.
local function add_tokens(key, tokens)
  local n = redis.pcall('ZCARD', key)
  if type(n) ~= 'number' or n >= MAX_WAKE then return end
  local args = {'ZADD', key, 'NX'}
  local at = int(now_ms())
  for i = 1, math.min(#tokens, MAX_WAKE - n) do push(args, at, tokens[i]) end
  redis.pcall(unpack(args))
  -- A partition also says "look" on its sharded channel (named as the key, so in its slot):
  -- a cluster's waker per node listens to its partitions' channels, where one BZPOPMIN
  -- cannot span slots. A server without sharded channels (Redis 6.2) or a user without
  -- the channel only loses the message: the token stays, for the waker per partition.
  if PARTITION then redis.pcall('SPUBLISH', key, '1') end
end

local function send_signals()
  for _, key in ipairs({WAKE_READY, WAKE_LEASES}) do
    if SIGNALS[key] then add_tokens(key, SIGNALS[key]) end
  end
  SIGNALS = {}
end
