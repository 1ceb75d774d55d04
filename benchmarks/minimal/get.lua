-- minimal get (benchmarks/README.md): the floor of run_get on layout 5.
-- KEYS[1]  P.."r:"..run         KEYS[2] P.."meta" (not read)
-- ARGV[1]  key prefix           ARGV[2] run
-- Reply    as run_get: {0, {revision, record, owner|false, live 0|1, claim_key|false,
--          claim_dep_rev|'', claimed_at|false, takeovers, token|false, attempts,
--          not_before|false, quarantined ''|'p'|'f'}, 0, -1} | {1, false, 0, -1}
-- Commands: GET of the run's string (record, header, trailer in one read: the record is
-- handed back whole anyway) and, for a held run, TIME (whether its lease is live). The
-- header is read by one string.match (codec.lua's HEADER) from its place in the value.
-- Left out: the layout check, every validation of the stored fields (a damaged run is
-- misread, not answered CORRUPT), the record ceiling.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local v = redis.call('GET', KEYS[1])
if not v then return {1, false, 0, -1} end
-- The trailer: the header region's length in decimal, then the count of those digits.
local n = #v
local d = string.byte(v, n) - 48
local len = n - d - 1 - tonumber(string.sub(v, n - d, n - 1))
local rev, exp, tok, cdr, cat, _, _, _, _, _, _, tk, at, nb, px, _, lo, lc, _, pos =
  string.match(v, HEADER, len + 1)
lo = tonumber(lo)
local own, live, token = false, 0, false
if lo > 0 then
  own = string.sub(v, pos, pos + lo - 1)
  local t = redis.call('TIME')
  if tonumber(exp) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then live = 1 end
  token = tonumber(tok) or 0
end
local ck = false
if cat ~= '' then
  ck, cat = string.sub(v, pos + lo, pos + lo + tonumber(lc) - 1), tonumber(cat)
else
  cat = false
end
return {0, {tonumber(rev), string.sub(v, 1, len), own, live, ck, cdr, cat, tonumber(tk) or 0,
  token, tonumber(at) or 0, nb ~= '' and tonumber(nb), px}, 0, -1}
