-- minimal get (benchmarks/README.md): the floor of run_get on layout 4.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."meta" (not read)
-- ARGV[1]  key prefix           ARGV[2] run
-- Reply    as run_get: {0, {revision, record, owner|false, live 0|1, claim_key|false,
--          claim_dep_rev|'', claimed_at|false, takeovers}, 0, -1} | {1, false, 0, -1}
-- Commands: GET of the run's string (record, header, trailer in one read) and, for a held
-- run, TIME (whether its lease is live). Left out: the layout check, every validation of
-- the stored fields (a damaged run is misread, not answered CORRUPT).
local v = redis.call('GET', KEYS[1])
if not v then return {1, false, 0, -1} end
-- The trailer: the header's length in decimal, then the count of those digits.
local d = tonumber(string.sub(v, -1))
local size = tonumber(string.sub(v, -1 - d, -2))
local len = #v - size - d - 1
local h = string.sub(v, len + 1, len + size)
-- The header's fields in order, each ended by ','; owner and claim key are "n:text".
local f, pos = {}, 1
for i = 1, 15 do
  local c = string.byte(h, pos)
  if c == nil or c == 32 then break end
  local e
  if (i == 2 or i == 4 or i == 8 or i == 13) and c ~= 44 then
    local digits = string.match(h, '^%d+', pos)
    e = pos + #digits + 1 + tonumber(digits)
  else
    e = string.find(h, ',', pos, true)
  end
  f[i] = string.sub(h, pos, e - 1)
  pos = e + 1
end
local owner, live = false, 0
if f[2] and f[2] ~= '' then
  owner = string.sub(f[2], string.find(f[2], ':', 1, true) + 1)
  local t = redis.call('TIME')
  if tonumber(f[3]) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then live = 1 end
end
local ck, cdr, cat = false, '', false
if f[6] and f[6] ~= '' then
  ck, cdr, cat = string.sub(f[4], string.find(f[4], ':', 1, true) + 1), f[5], tonumber(f[6])
end
local tk = 0
if f[15] and f[15] ~= '' then tk = tonumber(f[15]) end
return {0, {tonumber(f[1]), string.sub(v, 1, len), owner, live, ck, cdr, cat, tk}, 0, -1}
