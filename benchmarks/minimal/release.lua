-- minimal release (benchmarks/README.md): the floor of run_release on layout 4,
-- per run: read its header, rewrite it without the lease, take its lease index entry out.
-- KEYS[1]  P.."leases", KEYS[2] P.."ready", KEYS[3] P.."meta" (not read)
-- ARGV     as run_release: [1] key prefix, [2] owner, [3] projection version (not read),
--          [4..] run ids
-- Reply    {0, {released run ids, in the given order}, 0, -1}
-- Also touches (same hash tag): P.."r:"..run of each run, P.."L/" (the leases directory),
-- P.."L|"..bound (its buckets).
-- Commands, per run: GETRANGE of the last 192 bytes (STRLEN too when the string is longer:
-- the header's place), SETRANGE of the header (no owner, expiry or claim info), and the
-- lease entry out: ZREVRANGEBYLEX of the directory, ZREM, and for a bucket other than the
-- first, EXISTS (an emptied bucket leaves the directory). Left out: argument checks, the
-- layout check, validation of the stored fields, a wait (a released run with one goes to
-- the ready index: these have none), the poison mark, signals.
local P, owner = ARGV[1], ARGV[2]
local who = #owner .. ':' .. owner
local dir, pre = P .. 'L/', P .. 'L|'
local out = {}
for i = 4, #ARGV do
  local run = ARGV[i]
  local k = P .. 'r:' .. run
  local tail = redis.call('GETRANGE', k, -192, -1)
  local d = tonumber(string.sub(tail, -1))
  local size = tonumber(string.sub(tail, -1 - d, -2))
  local total = #tail
  if total == 192 then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  local h
  if size + d + 1 <= #tail then
    h = string.sub(tail, -size - d - 1, -d - 2)
  else
    h = redis.call('GETRANGE', k, len, len + size - 1)
  end
  -- Revision, owner ("n:text"), expiry, then the claim info (claim key "n:text").
  local e1 = string.find(h, ',', 1, true)
  if string.sub(h, e1 + 1, e1 + #who) == who and string.byte(h, e1 + #who + 1) == 44 then
    local e3 = string.find(h, ',', e1 + #who + 2, true)
    local exp = string.sub(h, e1 + #who + 2, e3 - 1)
    local pos = e3 + 1
    local c = string.byte(h, pos)
    if c and c ~= 44 and c ~= 32 then  -- a claim key: skip its text
      local digits = string.match(h, '^%d+', pos)
      pos = pos + #digits + 1 + tonumber(digits)
    end
    if c and c ~= 32 then pos = string.find(h, ',', string.find(h, ',', pos + 1, true) + 1, true) end
    -- The fields after the claim info stay (no wait here, a takeover count may be there).
    local rest = c and c ~= 32 and string.match(h, '^(.-) *$', pos + 1) or ''
    local nh
    if rest == '' then
      nh = string.sub(h, 1, e1)
    else
      nh = string.sub(h, 1, e1) .. ',,,,,' .. rest
    end
    if #nh <= size then
      redis.call('SETRANGE', k, len, nh .. string.rep(' ', size - #nh))
    else
      local digits = tostring(#nh)
      redis.call('SETRANGE', k, len, nh .. digits .. #digits)
    end
    local cb = string.rep('0', 16 - #exp) .. exp .. run
    local b = redis.call('ZREVRANGEBYLEX', dir, '[' .. cb, '-', 'LIMIT', 0, 1)[1] or ''
    redis.call('ZREM', pre .. b, run)
    if b ~= '' and redis.call('EXISTS', pre .. b) == 0 then redis.call('ZREM', dir, b) end
    out[#out + 1] = run
  end
end
return {0, out, 0, -1}
