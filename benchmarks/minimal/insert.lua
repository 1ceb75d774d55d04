-- minimal insert (benchmarks/README.md): the floor of run_insert with a Claim on
-- layout 4: the run's string and its lease index entry.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."leases", KEYS[3] P.."ready" (not read)
-- KEYS[4]  P.."meta"
-- ARGV     as run_insert: [1] key prefix, [2] run, [3] record, [4] 'c' (Claim), [5] owner,
--          [6] ttl ms; [7..11] the wait and projection version (not read: no wait)
-- Reply    {0, revision, 0, -1} | {2, false, 0, -1} (the run exists; nothing written)
-- Also touches (same hash tag): P.."L/" (the leases directory), P.."L|"..bound (its buckets).
-- Commands: HGET meta deleted-rev (the revision starts above it), TIME (the lease's
-- expiry), SET NX of record .. header .. trailer (the existence check and the write in one),
-- ZREVRANGEBYLEX of the directory (the entry's bucket), ZADD, ZCARD (a bucket past 128
-- entries is split, as the real script does). Left out: argument checks, the layout check,
-- the dependents' re-indexing (no run waits on a new id here), wake-up signals.
local P, run, record, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local rev = tonumber(redis.call('HGET', KEYS[4], 'deleted-rev') or '0') + 1
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[6])
local h = string.format('%d', rev) .. ',' .. #owner .. ':' .. owner .. ',' ..
  string.format('%d', exp) .. ','
local digits = tostring(#h)
if not redis.call('SET', KEYS[1], record .. h .. digits .. #digits, 'NX') then
  return {2, false, 0, -1}
end
-- The lease entry: bucket P.."L|"..bound, bound the greatest in the directory up to the
-- entry's composite (16 digits of score, then the run id), '' for the first bucket.
local dir, pre, score = P .. 'L/', P .. 'L|', string.format('%d', exp)
local c = string.rep('0', 16 - #score) .. score .. run
local b = redis.call('ZREVRANGEBYLEX', dir, '[' .. c, '-', 'LIMIT', 0, 1)[1] or ''
redis.call('ZADD', pre .. b, score, run)
local n = redis.call('ZCARD', pre .. b)
if n > 128 then
  -- Split as lua/_lib/buckets.lua's split: the first 64 stay, the rest go to new buckets of 64 (the
  -- last takes what is left), each bound the composite of its first entry.
  local all = redis.call('ZRANGE', pre .. b, 0, -1, 'WITHSCORES')
  local parts = math.floor(n / 64)
  redis.call('DEL', pre .. b)
  for p = 1, parts do
    local from, last = (p - 1) * 128 + 1, #all
    if p < parts then last = p * 128 end
    local bound = b
    if p > 1 then bound = string.rep('0', 16 - #all[from + 1]) .. all[from + 1] .. all[from] end
    local args = {'ZADD', pre .. bound}
    for i = from, last, 2 do
      args[#args + 1] = all[i + 1]
      args[#args + 1] = all[i]
    end
    redis.call(unpack(args))
    if p > 1 then redis.call('ZADD', dir, 0, bound) end
  end
end
return {0, rev, 0, -1}
