-- codec.lua: a run's stored form: the header and trailer of layouts 2 to 4, the hash of layout 1.

local function run_key(run)
  return P .. RUN_KEY .. run
end

local FIELDS = {'rev', 'own', 'exp', 'ck', 'cdr', 'cat', 'wk', 'wa', 'wn', 'wdl', 'wrev',
                'wpv', 'pk', 'pt', 'tk', 'px', 'rt'}

-- Layout 2 stores these fields as length-prefixed text ("6:node-a"), the others as decimals.
local TEXT = {own = true, ck = true, wa = true, pk = true}

-- Layout 2's header: FIELDS in order, each ended by ',' ('' for absent; absent fields at
-- the end are left out), then room (spaces) left by a header that shrank. decode gives the
-- fields as text (absent: nil), or nil and the field that is malformed.
local function decode(h)
  local raw, pos, n = {}, 1, #h
  for i = 1, #FIELDS do
    local name, c = FIELDS[i], string.byte(h, pos)
    if c == nil or c == 32 then break end
    if TEXT[name] and c ~= 44 then
      local digits = string.match(h, '^(%d+):', pos)
      local len = decimal(digits, 0, n)
      if not len then return nil, name end
      local from = pos + #digits + 1
      raw[name] = string.sub(h, from, from + len - 1)
      pos = from + len
      if #raw[name] ~= len or string.byte(h, pos) ~= 44 then return nil, name end
    else
      local e = string.find(h, ',', pos, true)
      if not e then return nil, name end
      if e > pos then raw[name] = string.sub(h, pos, e - 1) end
      pos = e
    end
    pos = pos + 1
  end
  if pos <= n and not string.find(h, '^ *$', pos) then return nil, 'header' end
  return raw
end

local function text_field(x)
  if x then return #x .. ':' .. x end
  return ''
end

local function number_field(n)
  if n then return int(n) end
  return ''
end

-- The layout 2 header of state s (see decode). Built in one table, without push (a call
-- per field costs more than the rest of the header).
local function header(s)
  local ck, cdr, cat = '', '', ''
  if s.cat then ck, cdr, cat = text_field(s.ck or ''), number_field(s.cdr), int(s.cat) end
  local wk, wa, wn, wdl, wrev, wpv, pk, pt = '', '', '', '', '', '', '', ''
  if s.wk then
    wk, wn, wdl, wrev, wpv = s.wk, number_field(s.wn), number_field(s.wdl), int(s.wrev),
      int(s.wpv)
    wa, pk, pt = text_field(s.wk ~= 'a' and s.wa), text_field(s.pk),
      number_field(s.pk and s.pt)
  end
  local f = {int(s.rev), text_field(s.own), number_field(s.own and s.exp), ck, cdr, cat, wk,
             wa, wn, wdl, wrev, wpv, pk, pt, number_field(s.tk > 0 and s.tk),
             number_field(s.px and 1), number_field(NS >= 4 and s.rt)}
  -- Absent fields at the end are left out (a text field's own bytes may end in ',').
  local n = #f
  while n > 1 and f[n] == '' do n = n - 1 end
  return table.concat(f, ',', 1, n) .. ','
end

-- The header region's trailer: its length in decimal, then the count of those digits.
local function trailer(size)
  local digits = int(size)
  return digits .. #digits
end

-- The longest header region a run may have (6 digits in the trailer).
local MAX_HEADER = 999999

-- Bytes read from the end of a layout 2 value at first: most headers fit.
local TAIL = 192

-- The raw fields of a layout 2 run (a string: record, header region, trailer), with the
-- record's length and the region's; nil when the key is absent; false and a reason when
-- the value is malformed.
local function stored_v2(k, tail)
  if tail == '' then
    if redis.call('EXISTS', k) == 1 then return false, 'header' end
    return nil
  end
  local d = tonumber(string.sub(tail, -1))
  local size = d and d >= 1 and d <= 6 and decimal(string.sub(tail, -1 - d, -2), 1, MAX_HEADER)
  if not size then return false, 'header' end
  local total = #tail
  if total == TAIL then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  if len < 0 then return false, 'header' end
  local h
  if size + d + 1 <= #tail then
    h = string.sub(tail, -size - d - 1, -d - 2)
  else
    h = redis.call('GETRANGE', k, len, len + size - 1)
  end
  local raw, bad = decode(h)
  if not raw then return false, bad end
  raw.v, raw.len, raw.region = 2, len, size
  return raw
end

-- The raw fields of a layout 1 run (a hash), as stored_v2.
local function stored_v1(k)
  local v = redis.pcall('HMGET', k, unpack(FIELDS))
  if v.err then return false, wrong_type(v) end
  if not v[1] then
    if redis.call('EXISTS', k) == 1 then return false, 'rev' end
    return nil
  end
  -- A run moved to layout 2 by a write is rewritten whole: its record must be there.
  if NS >= 2 and redis.call('HEXISTS', k, 'rec') == 0 then return false, 'rec' end
  local raw = {v = 1}
  for i = 1, #FIELDS do raw[FIELDS[i]] = v[i] or nil end
  return raw
end

local function stored(k)
  READ[k] = true
  if NS == 1 then return stored_v1(k) end
  local tail = redis.pcall('GETRANGE', k, -TAIL, -1)
  if type(tail) == 'table' then
    wrong_type(tail)
    return stored_v1(k)
  end
  return stored_v2(k, tail)
end
