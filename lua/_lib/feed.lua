-- feed.lua: the change feed (docs/contract.md, "The change feed"; docs/design/feed.md): the
-- events a script's operations note, sent after its writes as one entry of the stream FEED,
-- numbered by meta's feed-n, while the namespace records a feed (meta's feed field, read
-- with the layout: feed_config). A namespace without one notes nothing.

-- The namespace's feed bounds (entries kept, ms kept), or false: no feed.
local FEED_MAX, FEED_MS = false, false
local FEED_EVENTS = {}
local FEED_OWNER = ''

-- Take the bounds meta records (its feed field: entries kept, a colon, ms kept); one of
-- another shape keeps no feed.
local function feed_config(v)
  local max, ms = string.match(v, '^([1-9]%d?%d?%d?%d?%d?%d?%d?%d?):([1-9]%d*)$')
  if ms and #ms <= 15 then FEED_MAX, FEED_MS = max, tonumber(ms) end
end

-- Note an event of the script's entry: run's change of kind code (one letter: i w c t r d
-- q b) at revision rev, by owner (false: none named).
local function feed_note(run, code, rev, owner)
  if not FEED_MAX then return end
  if type(rev) == 'number' then rev = int(rev) end
  FEED_EVENTS[#FEED_EVENTS + 1] = code .. rev .. ':' .. #run .. ':' .. run
  if owner and owner ~= '' then FEED_OWNER = owner end
end

-- Whether the feed's key can take the entry (absent or a stream): asked before a script's
-- first write when the feed is on; else the script answers CORRUPT 'feed', nothing written.
local function feed_ok()
  if not FEED_MAX then return true end
  local t = redis.pcall('TYPE', FEED)
  if type(t) == 'table' and t.err then error('ABORTED ' .. tostring(t.err)) end
  t = type(t) == 'table' and t.ok or t
  return t == 'none' or t == 'stream'
end

-- Send the events noted as one entry (nothing noted: nothing sent), numbered by meta's
-- feed-n, trimmed by the bounds: MAXLEN ~ each entry, MINID every 128th (exact: `~` on
-- fakeredis drops entries younger than asked).
local function feed_send()
  if #FEED_EVENTS == 0 then return end
  local n = redis.call('HINCRBY', META, 'feed-n', 1)
  redis.call('XADD', FEED, 'MAXLEN', '~', FEED_MAX, '*', 'n', n, 'o', FEED_OWNER, 'e',
    table.concat(FEED_EVENTS))
  if n % 128 == 0 then redis.call('XTRIM', FEED, 'MINID', int(now_ms() - FEED_MS)) end
  FEED_EVENTS, FEED_OWNER = {}, ''
end
