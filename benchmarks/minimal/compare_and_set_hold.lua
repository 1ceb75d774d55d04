-- minimal compare_and_set with Hold (benchmarks/README.md): the floor of
-- run_compare_and_set writing the next revision of a run its writer holds, on layout 4.
-- KEYS[1]  P.."r:"..run         KEYS[2..4] P.."leases", P.."ready", P.."meta" (not read)
-- ARGV     as run_compare_and_set: [1] key prefix, [2] run, [3] expected revision,
--          [4] record, [5] 'h' (Hold), [6] owner; [7..12] ttl, wait, projection version
--          (not read: no wait)
-- Reply    {0, false, 0, -1} | {1, false, 0, -1} (no run) | {3, revision, 0, -1} (another
--          revision) | {4, {owner|false, 0}, 0, -1} (held by another); nothing written
--          but on 0
-- Commands: GETRANGE of the last 192 bytes (the header: revision, holder, expiry, claim
-- info), SET of record .. header .. trailer. The lease and its index entry stay as they
-- are. Left out: argument checks, the layout check, validation of the stored fields, the
-- dependents' re-indexing (no run waits on it here), a wait (the record has none: its wait
-- fields are cleared, as the real script does), the poison mark.
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
-- Fields 1-6 (revision, owner, expiry, claim key, claim dependency revision, claimed at);
-- owner and claim key are "n:text". A write keeps them and clears the rest.
local f, pos = {}, 1
for i = 1, 6 do
  local c = string.byte(h, pos)
  if c == nil or c == 32 then
    for j = i, 6 do f[j] = '' end
    break
  end
  local e
  if (i == 2 or i == 4) and c ~= 44 then
    local digits = string.match(h, '^%d+', pos)
    e = pos + #digits + 1 + tonumber(digits)
  else
    e = string.find(h, ',', pos, true)
  end
  f[i] = string.sub(h, pos, e - 1)
  pos = e + 1
end
if f[1] ~= ARGV[3] then return {3, tonumber(f[1]), 0, -1} end
local owner = ARGV[6]
if f[2] ~= #owner .. ':' .. owner then
  return {4, {f[2] ~= '' and string.sub(f[2], string.find(f[2], ':', 1, true) + 1), 0}, 0, -1}
end
f[1] = string.format('%d', tonumber(f[1]) + 1)
local n = 6
while n > 1 and f[n] == '' do n = n - 1 end
local nh = table.concat(f, ',', 1, n) .. ','
local digits = tostring(#nh)
redis.call('SET', k, ARGV[4] .. nh .. digits .. #digits)
return {0, false, 0, -1}
