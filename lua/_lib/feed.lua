-- feed.lua: the change feed (docs/contract.md, "The change feed"; docs/design/feed.md): the
-- events a script's operations note, sent after its writes as one entry of the stream FEED,
-- numbered by meta's feed-n, while the namespace records a feed (meta's feed field, read
-- with the layout: feed_config). A namespace without one notes nothing. Beside the entry,
-- the claims, finishes and takeovers it holds are counted per minute (rates_send).

-- A script's feed, one table (one local: the fused scripts are near Lua's 200): max and ms,
-- the namespace's bounds (entries kept, ms kept), or false: no feed; events and owner, the
-- entry to send; counts, its claims (c; takeovers among them, t) and finishes (f), counted
-- per minute with it (rates_send): from what the script did, never from its arguments. A
-- finish counts itself (op_finish): its events are a write, a release or a quarantine.
local FEED_STATE = {max = false, ms = false, events = {}, owner = '',
                    counts = {c = 0, t = 0, f = 0}}

-- Take the bounds meta records (its feed field: entries kept, a colon, ms kept); one of
-- another shape keeps no feed.
local function feed_config(v)
  local max, ms = string.match(v, '^([1-9]%d?%d?%d?%d?%d?%d?%d?%d?):([1-9]%d*)$')
  if ms and #ms <= 15 then FEED_STATE.max, FEED_STATE.ms = max, tonumber(ms) end
end

-- Note an event of the script's entry: run's change of kind code (one letter: i w c t r d
-- q b) at revision rev, by owner (false: none named).
local function feed_note(run, code, rev, owner)
  if not FEED_STATE.max then return end
  if type(rev) == 'number' then rev = int(rev) end
  FEED_STATE.events[#FEED_STATE.events + 1] = code .. rev .. ':' .. #run .. ':' .. run
  if owner and owner ~= '' then FEED_STATE.owner = owner end
  if code == 'c' or code == 't' then
    FEED_STATE.counts.c = FEED_STATE.counts.c + 1
    if code == 't' then FEED_STATE.counts.t = FEED_STATE.counts.t + 1 end
  end
end

-- Whether the feed's key can take the entry (absent or a stream): asked before a script's
-- first write when the feed is on; else the script answers CORRUPT 'feed', nothing written.
local function feed_ok()
  if not FEED_STATE.max then return true end
  local t = redis.pcall('TYPE', FEED)
  if type(t) == 'table' and t.err then error('ABORTED ' .. tostring(t.err)) end
  t = type(t) == 'table' and t.ok or t
  return t == 'none' or t == 'stream'
end

-- The per-minute counters (docs/design/feed.md, "Per-minute counters"): the hash RATES of
-- at most 3 * RATE.slots fields, 'c' (claims), 'f' (finishes) or 't' (takeovers) then the
-- minute's slot (its number mod RATE.slots: the hour read, and the minute being reused).
-- A field is the minute's number times RATE.shift plus its count: one HINCRBY counts,
-- and answers whether the field was still of an older minute (then set afresh). Its
-- values are integers the server parses in place, so no value is read whole here.
local RATE = {slots = 61, shift = 16777216}

-- Count the claims, takeovers and finishes noted since the last count in this minute's
-- slot (nothing noted, or no feed: nothing sent). The operations that count call it after
-- their commit (op_finish, op_claim: the scripts that never count do not carry it), so
-- every call that may be refused is a pcall. A damaged key (another type, a field that is
-- not a count or would overflow) is renamed aside, as set_aside does (a time of its own:
-- no rename overwrites, so frees, a big key), listed in the quarantine as
-- "damaged|rates", and a fresh one counts; a refusal of those (a quarantine of another
-- type, a name taken) leaves the counts out. Never a script error after a write.
local function rates_send()
  local counts = FEED_STATE.counts
  local c, t, f = counts.c, counts.t, counts.f
  if c + f == 0 or not FEED_STATE.max then return end
  counts.c, counts.t, counts.f = 0, 0, 0
  local minute = math.floor(now_ms() / 60000)
  local slot, stamp = int(minute % RATE.slots), minute * RATE.shift
  -- Straight code, no table or closure made: each costs the server a call's worth.
  for i = 1, 3 do
    local n = (i == 1 and c) or (i == 2 and t) or f
    if n > 0 then
      local field = ((i == 1 and 'c') or (i == 2 and 't') or 'f') .. slot
      local v = redis.pcall('HINCRBY', RATES, field, n)
      if type(v) ~= 'number' then
        local aside = P .. DAMAGED_KEY .. 'rates:' .. int(now_ms())
        if redis.pcall('RENAMENX', RATES, aside) ~= 1 then return end
        redis.pcall('HSET', QUARANTINE, 'damaged|rates', 'value')
        v = redis.pcall('HINCRBY', RATES, field, n)
        if type(v) ~= 'number' then return end
      end
      if v < stamp or v >= stamp + RATE.shift then
        -- A count of an older minute (or of none): this minute's starts with n.
        redis.call('HSET', RATES, field, int(stamp + n))
      end
    end
  end
end

-- Send the events noted as one entry (nothing noted: nothing sent), numbered by meta's
-- feed-n, trimmed by the bounds: MAXLEN ~ each entry, MINID every 128th (exact: `~` on
-- fakeredis drops entries younger than asked). Its id is the time and n (ms-n): past every
-- id the feed ever had, a stream deleted under it too (a server-made id starts a new
-- stream's millisecond at 0 again, not past a cursor given in that millisecond); a clock
-- that went back (an id under the stream's last) takes a server-made one.
local function feed_send()
  if #FEED_STATE.events == 0 then return end
  local n = redis.call('HINCRBY', META, 'feed-n', 1)
  local events = table.concat(FEED_STATE.events)
  local added = redis.pcall('XADD', FEED, 'MAXLEN', '~', FEED_STATE.max,
    int(now_ms()) .. '-' .. int(n), 'n', n, 'o', FEED_STATE.owner, 'e', events)
  if type(added) == 'table' then
    redis.call('XADD', FEED, 'MAXLEN', '~', FEED_STATE.max, '*', 'n', n, 'o',
      FEED_STATE.owner, 'e', events)
  end
  if n % 128 == 0 then redis.call('XTRIM', FEED, 'MINID', int(now_ms() - FEED_STATE.ms)) end
  FEED_STATE.events, FEED_STATE.owner = {}, ''
end
