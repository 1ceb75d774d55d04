-- run_rates: the per-minute counts of claims, finishes and takeovers of the last minutes,
-- as a namespace with a feed keeps them (lua/_lib/feed.lua's rates_send).
-- KEYS[1]  P.."rates"
-- ARGV[1]  key prefix           ARGV[2] minutes (1 to 60): this one and those before it
-- Reply    {OK, {minute, claims, finishes, takeovers, ...}} oldest first, minute being the
--          minute's number (backend ms / 60000), one row per minute asked; a key of another
--          type reads as no counts (the next count sets it aside)
-- Each field is sized before it is read; one that is not a count of that minute reads 0.
--- @include OK, now_ms, RATES, int, decimal, RATE, arg_int, MAX_INT
local minutes = arg_int(2, 1, 60)
local now = math.floor(now_ms() / 60000)
local t = redis.pcall('TYPE', RATES)
t = type(t) == 'table' and t.ok or t
local out = {}
for m = now - minutes + 1, now do
  local slot = int(m % RATE.slots)
  out[#out + 1] = m
  for _, letter in ipairs({'c', 'f', 't'}) do
    local n = 0
    if t == 'hash' and redis.call('HSTRLEN', RATES, letter .. slot) <= 16 then
      local v = decimal(redis.call('HGET', RATES, letter .. slot) or '', 0, MAX_INT)
      if v and v >= m * RATE.shift and v < (m + 1) * RATE.shift then n = v - m * RATE.shift end
    end
    out[#out + 1] = n
  end
end
return {OK, out, 0, -1}
