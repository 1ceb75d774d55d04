-- minimal compare_and_set with Release (benchmarks/README.md): the floor of
-- run_compare_and_set writing the next revision of a held run and freeing it, on layout 4.
-- KEYS[1]  P.."r:"..run         KEYS[2..4] P.."leases", P.."ready", P.."meta" (not read)
-- ARGV     as run_compare_and_set: [1] key prefix, [2] run, [3] expected revision,
--          [4] record, [5] 'r' (Release); [6..12] owner, ttl, wait, projection version
--          (not read: no wait)
-- Reply    {0, false, 0, -1} | {1, false, 0, -1} (no run) | {3, revision, 0, -1} (another
--          revision); nothing written but on 0
-- Also touches (same hash tag): P.."L/" (the leases directory), P.."L|"..bound (its buckets).
-- Commands: GETRANGE of the last 192 bytes (the header: revision, holder, expiry), SET of
-- record .. header .. trailer (the header is the revision alone: no lease, no claim info,
-- no wait), and the lease entry out of its bucket: ZREVRANGEBYLEX of the directory, ZREM,
-- and for a bucket other than the first, EXISTS (an emptied bucket leaves the directory).
-- Left out: argument checks, the layout check, validation of the stored fields, the
-- dependents' re-indexing, a wait (the record has none), the poison mark, signals.
local k = KEYS[1]
local tail = redis.call('GETRANGE', k, -192, -1)
if tail == '' then return {1, false, 0, -1} end
local d = tonumber(string.sub(tail, -1))
local size = tonumber(string.sub(tail, -1 - d, -2))
local h
if size + d + 1 <= #tail then
  h = string.sub(tail, -size - d - 1, -d - 2)
else
  local len = redis.call('STRLEN', k) - size - d - 1
  h = redis.call('GETRANGE', k, len, len + size - 1)
end
-- Fields 1-3: revision, owner ("n:text" or empty), expiry.
local e = string.find(h, ',', 1, true)
local rev = string.sub(h, 1, e - 1)
if rev ~= ARGV[3] then return {3, tonumber(rev), 0, -1} end
local exp
if string.byte(h, e + 1) ~= 44 and string.byte(h, e + 1) ~= 32 and e < #h then
  local digits = string.match(h, '^%d+', e + 1)
  local after = e + 1 + #digits + 1 + tonumber(digits)
  exp = string.sub(h, after + 1, string.find(h, ',', after + 1, true) - 1)
end
local nh = string.format('%d', tonumber(rev) + 1) .. ','
local digits = tostring(#nh)
redis.call('SET', k, ARGV[4] .. nh .. digits .. #digits)
if exp then
  local P, run = ARGV[1], ARGV[2]
  local dir, pre = P .. 'L/', P .. 'L|'
  local c = string.rep('0', 16 - #exp) .. exp .. run
  local b = redis.call('ZREVRANGEBYLEX', dir, '[' .. c, '-', 'LIMIT', 0, 1)[1] or ''
  redis.call('ZREM', pre .. b, run)
  if b ~= '' and redis.call('EXISTS', pre .. b) == 0 then redis.call('ZREM', dir, b) end
end
return {0, false, 0, -1}
