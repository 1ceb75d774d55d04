-- minimal release (benchmarks/README.md): the floor of run_release on layout 5, per
-- run: read its header, rewrite it without the lease, take its lease entry out.
-- KEYS[1]  P.."leases", KEYS[2] P.."ready" (not read: no wait), KEYS[3] P.."meta" (not read)
-- ARGV     as run_release: [1] key prefix, [2] owner, [3] projection version (not read),
--          [4..] run ids
-- Reply    {0, {released run ids, in the given order}, 0, -1}
-- Also touches (same hash tag): P.."r:"..run of each run.
-- Commands, per run: GETRANGE of the last 256 bytes (STRLEN too when the string is longer:
-- the header's place) and SETRANGE of the header (no owner, expiry or claim info; the
-- rest as it was); one ZREM of every released entry at the end. Left out: argument checks,
-- the layout check, validation of the stored fields, a wait (a released run with one goes
-- to the ready index: these have none), the quarantine (a poison run is not put back),
-- signals.
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'
local P, owner = ARGV[1], ARGV[2]
local out, rems = {}, {'ZREM', KEYS[1]}
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
    local rev, _, tok, _, _, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, _, sid, lo, lc, lw, pos =
      string.match(h, HEADER, from)
    if string.sub(h, pos, pos + lo - 1) == owner then
      local nh = rev .. ',,' .. tok .. ',,,' .. wk .. ',' .. wn .. ',' .. wdl .. ',' .. wrev ..
        ',' .. wpv .. ',' .. pt .. ',' .. tk .. ',' .. at .. ',' .. nb .. ',,' .. sid .. ',0,0,' ..
        lw .. ':' .. string.sub(h, pos + lo + lc, pos + lo + lc + lw - 1)
      if #nh <= size then
        redis.call('SETRANGE', k, len, nh .. string.rep(' ', size - #nh))
      else
        local digits = #nh .. ''
        redis.call('SETRANGE', k, len, nh .. digits .. #digits)
      end
      rems[#rems + 1] = run
      out[#out + 1] = run
    end
  end
end
if #out > 0 then redis.call(unpack(rems)) end
return {0, out, 0, -1}
