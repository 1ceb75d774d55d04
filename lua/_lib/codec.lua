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
-- (A size is an integer under MAX_HEADER: `..` writes it exactly, cheaper than a format.)
local function trailer(size)
  local digits = size .. ''
  return digits .. #digits
end

-- Write run key k whole, as a fast path does once every check passed: the record, then
-- the header region h and its trailer. A small record goes in one SET; a big one is not
-- copied into a Lua string again (SET, then SETRANGE after it).
local function put_run(k, record, h)
  if #record <= 8192 then
    redis.call('SET', k, record .. h .. trailer(#h))
  else
    redis.call('SET', k, record)
    redis.call('SETRANGE', k, #record, h .. trailer(#h))
  end
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

-- The fast paths' reading of a run (docs/design/hot-path.md: few functions, one table, no
-- state). It takes only what it is sure load would take, and more strictly (numbers of at
-- most 15 digits, no field where load ignores one); for anything else it answers nil and the
-- fast path hands the call, before any write, to the slow path, which judges it as today.

-- The string functions they call most, as locals (a global's field is two lookups a call).
local str_byte, str_find, str_sub = string.byte, string.find, string.sub

-- Whether x is a canonical decimal of at most 15 digits (so at most MAX_INT - 2).
local function dec15(x)
  return x == '0' or (#x <= 15 and str_find(x, '^[1-9]%d*$') ~= nil)
end

-- The field of header h at pos as stored (a text field with its "n:" prefix), '' when
-- empty, and where the next one starts; nil at the header's end; nil, nil when malformed.
local function raw_field(h, pos, text)
  local c = str_byte(h, pos)
  if c == nil or c == 32 then return nil, pos end
  local e
  if text and c ~= 44 then
    local digits = string.match(h, '^(%d+):', pos)
    if not digits or not dec15(digits) then return nil, nil end
    e = pos + #digits + 1 + tonumber(digits)
    if str_byte(h, e) ~= 44 then return nil, nil end
  else
    e = str_find(h, ',', pos, true)
    if not e then return nil, nil end
  end
  return str_sub(h, pos, e - 1), e + 1
end

-- The layout 2 run at key k as its raw fields, in FIELDS' order ('' for none; the text
-- fields with their "n:" prefix; no table: a fast path makes few), then len (the record's
-- length) and region (its header region's), when its header lies in its last TAIL bytes
-- and load would take every field; else nil.
local function raw_run(k)
  local tail = redis.pcall('GETRANGE', k, -TAIL, -1)
  if type(tail) ~= 'string' or tail == '' then return nil end
  local n = #tail
  local d = str_byte(tail, n) - 48
  if d < 1 or d > 6 then return nil end
  local size = str_sub(tail, n - d, n - 1)
  if size == '0' or not dec15(size) then return nil end
  size = tonumber(size)
  if size + d + 1 > n then return nil end
  local len = n
  if n == TAIL then len = redis.call('STRLEN', k) end
  len = len - size - d - 1
  if len < 0 then return nil end
  local h = str_sub(tail, n - size - d, n - d - 1)
  local rev, p = raw_field(h, 1)
  local own, exp, ck, cdr, cat, wk, wa, wn, wdl, wrev, wpv, pk, pt, tk, px, rt
  if p then own, p = raw_field(h, p, true) end
  if p then exp, p = raw_field(h, p) end
  if p then ck, p = raw_field(h, p, true) end
  if p then cdr, p = raw_field(h, p) end
  if p then cat, p = raw_field(h, p) end
  if p and cat then
    wk, p = raw_field(h, p)
    if p then wa, p = raw_field(h, p, true) end
    if p then wn, p = raw_field(h, p) end
    if p then wdl, p = raw_field(h, p) end
    if p then wrev, p = raw_field(h, p) end
    if p then wpv, p = raw_field(h, p) end
    if p then pk, p = raw_field(h, p, true) end
    if p then pt, p = raw_field(h, p) end
    if p then tk, p = raw_field(h, p) end
    if p then px, p = raw_field(h, p) end
    if p then rt, p = raw_field(h, p) end
  end
  if not p or not rev or (p <= #h and not str_find(h, '^ *$', p)) then return nil end
  own, exp, ck, cdr, cat = own or '', exp or '', ck or '', cdr or '', cat or ''
  tk, px, rt = tk or '', px or '', rt or ''
  if rev == '0' or not dec15(rev) or own == '0:' or (own == '') ~= (exp == '')
      or (exp ~= '' and not dec15(exp)) or (cat == '' and (ck ~= '' or cdr ~= ''))
      or (cat ~= '' and not dec15(cat)) or (cdr ~= '' and not dec15(cdr))
      or (px ~= '' and px ~= '1') or (rt ~= '' and not dec15(rt))
      or (tk ~= '' and (not dec15(tk) or tonumber(tk) > 2147483648)) then
    return nil
  end
  wk, wa, wn, wdl, wrev, wpv = wk or '', wa or '', wn or '', wdl or '', wrev or '', wpv or ''
  pk, pt = pk or '', pt or ''
  if wk == '' then
    if wa ~= '' or wn ~= '' or wdl ~= '' or wrev ~= '' or wpv ~= '' or pk ~= '' or pt ~= '' then
      return nil
    end
  elseif (wk ~= 'a' and (wa == '' or wa == '0:')) or (wk == 'a' and wa ~= '')
      or (wk == 'c' and wn ~= '' and not dec15(wn)) or (wk == 'p' and (wn == '0' or not dec15(wn)))
      or (wk == 'a' and not dec15(wn)) or (wk ~= 'a' and wk ~= 'c' and wk ~= 'p')
      or (wdl ~= '' and not dec15(wdl)) or not dec15(wrev) or not dec15(wpv)
      or pk == '0:' or (pt ~= '' and not dec15(pt)) then
    return nil
  end
  return rev, own, exp, ck, cdr, cat, wk, wa, wn, wdl, wrev, wpv, pk, pt, tk, px, rt, len, size
end

-- Whether the namespace is as a fast path needs it: one partition (P, nothing after it), at
-- layout 4 as its meta key records (and this library reads it), no migration under way; each field bounded first. With
-- extra, a field of at most 15 bytes read with them: its value (false when absent) after
-- true.
local function lean_layout(extra)
  if ARGV[1] ~= P or PARTITION or redis.pcall('HSTRLEN', META, 'layout') ~= 1
      or redis.call('HSTRLEN', META, 'old-ix') ~= 0
      or redis.call('HSTRLEN', META, 'partitions') ~= 0
      or (extra and redis.call('HSTRLEN', META, extra) > 15) then
    return false
  end
  local got = redis.call('HMGET', META, 'layout', 'old-ix', 'partitions', extra or 'layout')
  -- 4 is what the lean readers read; a library whose newest is below it refuses it (TOO_NEW,
  -- the slow path's answer).
  return got[1] == '4' and LAYOUT >= 4 and not got[2] and not got[3], got[4] or false
end
