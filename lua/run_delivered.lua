-- run_delivered: remove outbox entries their partitions were notified of, each only if no
-- newer version was announced since (that one is delivered by a later claim), and entries
-- whose score is no version (a foreign write). The same for the unwatch queue: entries
-- their partitions acknowledged (run_unwatch), unless a newer unwatch was queued since.
-- KEYS[1]  P.."outbox"
-- ARGV[1]  key prefix (a partition's, {ns#p}:)   ARGV[2] which queue: "outbox" or "unwatch"
-- ARGV[3..] pairs: entry ("<partition>|<run>"), the version delivered or the watch number
--          acknowledged (at most 100 pairs)
-- ARGV[2] "outbox!" or "unwatch!" (no pairs): set that queue aside if it is damaged (of
--          another type, or more bytes than its entries can take: see run_heads)
-- Reply    {OK, entries removed}
-- Also touches, undeclared (same hash tag): P.."unwatch", P.."quarantine",
-- P.."damaged:".. (a queue set aside).
--- @include MAX_TEXT, OK, now_ms, P, QUARANTINE, OUTBOX, int, of_type, arg_int
--- @include DAMAGED_KEY, MAX_INT, within
if (#ARGV - 2) % 2 ~= 0 or #ARGV - 2 > 200 then
  error('BADARG ARGV[3..] must be at most 100 pairs of entry and version')
end
if KEYS[1] ~= OUTBOX then error('BADARG KEYS[1] must be the outbox of ARGV[1]') end
local name, aside = ARGV[2], false
if name == 'outbox!' or name == 'unwatch!' then
  name, aside = string.sub(name, 1, -2), true
end
if name ~= 'outbox' and name ~= 'unwatch' then
  error('BADARG ARGV[2] must be outbox or unwatch, with a ! to set it aside')
end
local key = P .. name
if aside then
  -- The claim's heads found the queue damaged: if it still is, renamed aside (a name of
  -- its own: no rename deletes a big key) and listed in the quarantine; announcements
  -- start a fresh one.
  local n = of_type(key, 'zset') and redis.call('ZCARD', key)
  if n and (n == 0 or within(key, 65536 + n * 2 * (MAX_TEXT + 64), n)) then return {OK, 0, 0, -1} end
  redis.call('HSET', QUARANTINE, 'damaged|' .. name, n and 'size' or 'type')
  redis.call('RENAME', key, P .. DAMAGED_KEY .. name .. ':' .. int(now_ms()))
  return {OK, 0, 0, -1}
end
-- (The outbox routes the call; its type is asked either way.)
if not of_type(KEYS[1], 'zset') and key == KEYS[1] then return {OK, 0, 0, -1} end
if not of_type(key, 'zset') then return {OK, 0, 0, -1} end
local gone = {}
for i = 3, #ARGV, 2 do
  local v = arg_int(i + 1, 0, MAX_INT)
  local score = tonumber(redis.call('ZSCORE', key, ARGV[i]))
  -- A score no version has (a foreign write) goes too: never a wall.
  local bad = score and (score ~= math.floor(score) or score < 0 or score > MAX_INT)
  if score and (score <= v or bad) then gone[#gone + 1] = ARGV[i] end
end
if #gone > 0 then redis.call('ZREM', key, unpack(gone)) end
return {OK, #gone, 0, -1}
