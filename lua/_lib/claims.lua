-- claims.lua: the due entries of an index, in order, for a claim.

-- The due entries of ix (score <= now) in order, with their run's state and index score,
-- visiting at most limit + MAX_VISIT of them and stopping once out holds limit runs. An
-- entry whose run is missing, of another type or corrupt is quarantined on the way. Entries
-- are read in pages, each one entry longer than it needs (a claim of one run over a large
-- index copies three entries into the script, not limit + MAX_VISIT), so that the claim
-- knows the entry after the ones it visited: ix.after is that entry ({run, score}), false
-- when the index held no more, true when a page ended exactly there (unknown: read again).
-- The offsets hold because every write waits for commit. An index key of another type
-- stops the walk and sets ix.bad (the claim answers CORRUPT, nothing written).
local function due(ix, limit, out)
  local cap, visits, now = limit + MAX_VISIT, 0, now_ms()
  local page, i, offset, full = {}, 1, 0, true
  return function()
    while #out < limit and visits < cap do
      if page[i] == nil then
        if not full then
          ix.after = false
          return nil
        end
        local n = math.min(2 * (limit - #out), cap - visits) + 1
        page = redis.pcall('ZRANGE', ix.key, offset, offset + n - 1, 'WITHSCORES')
        if page.err then
          wrong_type(page)
          ix.bad = true
          return nil
        end
        if offset == 0 then TYPES[ix.key], READ[ix.key] = page[1] and 'zset' or 'none', true end
        offset, full, i = offset + n, #page == 2 * n, 1
        if page[1] == nil then
          ix.after = false
          return nil
        end
      end
      local run, score = page[i], tonumber(page[i + 1])
      if score > now then
        ix.after = {run, score}
        return nil
      end
      i = i + 2
      visits = visits + 1
      local s, bad = load(run)
      if s then return run, s, score end
      quarantine(ix, run, bad or 'missing')
    end
    if page[i] then
      ix.after = {page[i], tonumber(page[i + 1])}
    else
      ix.after = full
    end
    return nil
  end
end

-- Whether byte string a sorts before b, as the server compares members (Lua's own < follows
-- the server's locale). Ids differ early, so the loop is short.
local function bytes_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
