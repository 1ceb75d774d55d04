-- claims.lua: the due entries of an index, in order, for a claim.

-- The due entries of ix (score <= now) in order, with their run's state and index score,
-- visiting at most
-- limit + MAX_VISIT of them (an empty or dropped bucket counts as one) and stopping once
-- out holds limit runs. An entry whose run is missing, of another type or corrupt is
-- quarantined on the way; a bucket of another type is dropped (drop_bucket). Entries are
-- read in pages, the first just a little longer than limit: a claim of one run over a large
-- index copies a few entries into the script, not limit + MAX_VISIT. The offsets hold
-- because every write waits for commit. While migrating to layout 4 the old key's entries
-- are merged in.
local function due(ix, limit, out)
  local cap, visits, now = limit + MAX_VISIT, 0, now_ms()
  local function want() return math.min(math.max(2 * (limit - #out), 8), cap - visits) end
  local q = NS >= 4 and ix_queue(ix)
  local old
  if NS < 4 or OLD_IX then
    local page, i, read, full = {}, 1, 0, true
    old = function()
      if page[i] == nil then
        local n = want()
        if not full or n <= 0 then return nil end
        page = redis.call('ZRANGEBYSCORE', ix.old, '-inf', int(now), 'WITHSCORES', 'LIMIT',
          read, n)
        read, full, i = read + n, #page == 2 * n, 1
      end
      i = i + 2
      return page[i - 2], tonumber(page[i - 1])
    end
  end
  local new
  if NS >= 4 then
    local bounds, key, bound, page, i, offset, more = buckets(ix), nil, nil, {}, 1, 0, false
    new = function()
      while true do
        if page[i] then
          local run, score = page[i], tonumber(page[i + 1])
          i = i + 2
          if score > now then return nil end  -- buckets are in order: nothing later is due
          return run, score, bound
        end
        local n = want()
        if n <= 0 then return nil end
        if not more then
          bound = bounds()
          if bound == nil then return nil end
          key, offset = ix.pre .. bound, 0
          if q.dropped[bound] then
            more = false
          elseif not card_of(key) then
            if q.ndropped < 8 then drop_bucket(q, bound) end
            more = false
          else
            more = true
          end
          if not more then visits = visits + 1 end
        end
        if more then
          page = redis.call('ZRANGE', key, offset, offset + n - 1, 'WITHSCORES')
          -- An empty bucket (left by a foreign write) counts as a visit: never a wall.
          if offset == 0 and page[1] == nil then visits = visits + 1 end
          i, offset, more = 1, offset + n, #page == 2 * n
        end
      end
    end
  end
  local seen, ar, as, br, bs, bb = {}, nil, nil, nil, nil, nil
  return function()
    while #out < limit and visits < cap do
      if old and not ar then
        ar, as = old()
        if not ar then old = nil end
      end
      if new and not br then
        br, bs, bb = new()
        if not br then new = nil end
      end
      local run, score, bound
      if ar and (not br or as < bs or (as == bs and bytes_before(ar, br))) then
        run, score, ar = ar, as, nil
      elseif br then
        run, score, bound, br = br, bs, bb, nil
      else
        return nil
      end
      visits = visits + 1
      if not seen[run] then
        seen[run] = true
        if q then
          q.found[run] = bound ~= nil and score
          q.at[run] = bound
        end
        local s, bad = load(run)
        if s then return run, s, score end
        if s == nil then bad = 'missing' end
        quarantine(ix, run, bad)
      end
    end
    return nil
  end
end
