-- minimal renew (benchmarks/README.md): the floor of run_renew on layout 4, per
-- run: read its header, rewrite its expiry, move its lease index entry.
-- KEYS[1]  P.."leases", KEYS[2] P.."meta" (not read)
-- ARGV     as run_renew: [1] key prefix, [2] owner, [3] ttl ms, [4..] run ids
-- Reply    {0, {renewed run ids, in the given order}, 0, -1}
-- Also touches (same hash tag): P.."r:"..run of each run, P.."L/" (the leases directory),
-- P.."L|"..bound (its buckets).
-- Commands: TIME once; per run GETRANGE of the last 192 bytes (STRLEN too when the string
-- is longer: the header's place), SETRANGE of the header, and the entry's move:
-- ZREVRANGEBYLEX of the directory from the new place (two bounds, which also answer for
-- the old place unless a bound lies between), then ZADD in place when both are in one
-- bucket, else ZREM + ZADD (+ EXISTS of the old bucket, ZCARD of the new: empty or full).
-- Left out: argument checks, the layout and index checks, validation of the stored fields,
-- the poison mark, signals.
local P, owner = ARGV[1], ARGV[2]
local who = #owner .. ':' .. owner
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new = string.format('%d', now + tonumber(ARGV[3]))
local dir, pre = P .. 'L/', P .. 'L|'

-- Whether byte string a sorts at or before b, as the server compares.
local function le(a, b)
  if a == b then return true end
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Split bucket pre..b when it holds more than 128 entries, as lua/_lib/buckets.lua's split: the
-- first 64 stay, the rest go to new buckets of 64 (the last takes what is left), each
-- bound the composite of its first entry (16 digits of score, then the run id).
local function split(pre, dir, b, n)
  if n <= 128 then return end
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
  -- Revision, owner ("n:text"), expiry; the rest of the header stays as it is.
  local e1 = string.find(h, ',', 1, true)
  if string.sub(h, e1 + 1, e1 + #who) == who and string.byte(h, e1 + #who + 1) == 44 then
    local e3 = string.find(h, ',', e1 + #who + 2, true)
    local old = string.sub(h, e1 + #who + 2, e3 - 1)
    if tonumber(old) > now then
      local nh = string.sub(h, 1, e1 + #who + 1) .. new .. string.match(h, '^(.-) *$', e3)
      if #nh <= size then
        redis.call('SETRANGE', k, len, nh .. string.rep(' ', size - #nh))
      else
        local digits = tostring(#nh)
        redis.call('SETRANGE', k, len, nh .. digits .. #digits)
      end
      local oc = string.rep('0', 16 - #old) .. old .. run
      local nc = string.rep('0', 16 - #new) .. new .. run
      local got = redis.call('ZREVRANGEBYLEX', dir, '[' .. nc, '-', 'LIMIT', 0, 2)
      local bn, bo = got[1] or '', nil
      if not le(nc, oc) then
        if bn == '' or le(bn, oc) then
          bo = bn
        elseif got[2] == nil or le(got[2], oc) then
          bo = got[2] or ''
        end
      end
      if bo == nil then
        bo = redis.call('ZREVRANGEBYLEX', dir, '[' .. oc, '-', 'LIMIT', 0, 1)[1] or ''
      end
      if bo ~= bn then
        redis.call('ZREM', pre .. bo, run)
        if bo ~= '' and redis.call('EXISTS', pre .. bo) == 0 then redis.call('ZREM', dir, bo) end
      end
      redis.call('ZADD', pre .. bn, new, run)
      if bo ~= bn then split(pre, dir, bn, redis.call('ZCARD', pre .. bn)) end
      out[#out + 1] = run
    end
  end
end
return {0, out, 0, -1}
