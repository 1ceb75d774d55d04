-- minimal renew (benchmarks/README.md): the floor of run_renew on layout 5, per run:
-- read its header, rewrite its expiry, re-score its lease entry.
-- KEYS[1]  P.."leases", KEYS[2] P.."meta" (not read)
-- ARGV     as run_renew: [1] key prefix, [2] owner, [3] ttl ms, [4..] run ids
-- Reply    {0, {renewed run ids, in the given order}, 0, -1}
-- Also touches (same hash tag): P.."r:"..run of each run.
-- Commands: TIME once; per run GETRANGE of the last 256 bytes (STRLEN too when the string
-- is longer: the header's place) and SETRANGE of the header (the new expiry in place of
-- the old, the rest as it was); one ZADD of every renewed entry at the end. Left out:
-- argument checks, the layout and index checks, validation of the stored fields, signals.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local P, owner = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new = string.format('%d', now + tonumber(ARGV[3]))
local out, adds = {}, {'ZADD', KEYS[1]}
for i = 4, #ARGV do
  local run = ARGV[i]
  local k = P .. 'r:' .. run
  local tail = redis.call('GETRANGE', k, -256, -1)
  local n = #tail
  if n > 0 then
    local d = string.byte(tail, n) - 48
    local size = tonumber(string.sub(tail, n - d, n - 1))
    local total = n
    if n == 256 then total = redis.call('STRLEN', k) end
    local len = total - size - d - 1
    local h, from = tail, n - d - size
    if from < 1 then h, from = redis.call('GETRANGE', k, len, len + size - 1), 1 end
    local rev, exp, _, _, _, _, _, _, _, _, _, _, _, _, px, _, lo, lc, lw, pos =
      string.match(h, HEADER, from)
    if string.sub(h, pos, pos + lo - 1) == owner and tonumber(exp) > now and px ~= 'p' then
      -- The header up to its texts' end, the expiry replaced (room left by an earlier
      -- shrink is not kept: padded again as the real script pads).
      local nh = rev .. ',' .. new ..
        string.sub(h, from + #rev + 1 + #exp, pos + lo + lc + lw - 1)
      if #nh <= size then
        redis.call('SETRANGE', k, len, nh .. string.rep(' ', size - #nh))
      else
        local digits = #nh .. ''
        redis.call('SETRANGE', k, len, nh .. digits .. #digits)
      end
      adds[#adds + 1], adds[#adds + 2] = new, run
      out[#out + 1] = run
    end
  end
end
if #out > 0 then redis.call(unpack(adds)) end
return {0, out, 0, -1}
