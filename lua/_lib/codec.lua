-- codec.lua: a run's stored form in layout 5: the record, its header and the trailer.

local function run_key(run)
  return P .. RUN_KEY .. run
end

-- The header region's trailer: its length in decimal, then the count of those digits.
-- (One format of two integers: `..` of a number formats it as a float, several times
-- dearer.)
local function trailer(size)
  local d = size < 10 and 1 or size < 100 and 2 or size < 1000 and 3 or size < 10000 and 4
    or size < 100000 and 5 or 6
  return string.format('%d%d', size, d)
end


-- Bytes read from the end of a run's value at first: the header and its trailer, and the
-- whole value of a run whose record is small (then the record needs no read of its own).
local TAIL = 256
-- Its offset as GETRANGE takes it (a string: a number argument is formatted as a float).
local TAIL_FROM = '-256'

-- The header's numbers, one capture each, then the lengths of its texts and where they
-- start (keys.lua gives the fields).
local HEADER = '^(%d+),(%d*),(%d*),(%d*),(%d*),([acp]?),(%d*),(%d*),(%d*),(%d*),(%d*),' ..
  '(%d*),(%d*),(%d*),([fp]?),(%d*),(%d+),(%d+),(%d+):()'

local str_byte, str_find, str_sub = string.byte, string.find, string.sub

-- A stored number (a field HEADER read: digits only): '' is none (false); a decimal of at
-- most 16 digits, without a leading zero, at most hi; nil for anything else (the field is
-- corrupt).
local function num(x, hi)
  if x == '' then return false end
  if #x > 16 or (#x > 1 and str_byte(x) == 48) then return nil end
  local n = tonumber(x)
  if not n or n > hi then return nil end
  return n
end

local function opt_int(n)
  if n then return int(n) end
  return ''
end

-- The header of state s (see keys.lua), built in one table.
local function header(s)
  local own, ck, wa = s.own or '', '', s.wa or ''
  local cdr, cat = '', ''
  if s.cat then ck, cdr, cat = s.ck or '', opt_int(s.cdr), int(s.cat) end
  local wk, wn, wdl, wrev, wpv, pt = '', '', '', '', '', ''
  if s.wk then
    wk, wn, wdl, wrev, wpv = s.wk, opt_int(s.wn), opt_int(s.wdl), int(s.wrev), int(s.wpv)
    if s.wk == 'p' then pt = opt_int(s.pt) end
  end
  local tk, at = '', ''
  if s.tk > 0 then tk = int(s.tk) end
  if s.at > 0 then at = int(s.at) end
  return table.concat({int(s.rev), s.own and int(s.exp) or '', s.tok > 0 and int(s.tok) or '',
    cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, opt_int(s.nb), s.px or '',
    opt_int(s.sid), #own, #ck, #wa .. ':' .. own .. ck .. wa}, ',')
end

-- Write run key k whole: the record, then the header region h and its trailer. A small
-- record goes in one SET; a big one is not copied into a Lua string again (SET, then
-- SETRANGE after it: joined first, a 2 MiB record cost 6-9 ms more, measured).
local function put_run(k, record, h)
  if #record <= 8192 then
    later('SET', k, record .. h .. trailer(#h))
  else
    later('SET', k, record)
    later('SETRANGE', k, #record, h .. trailer(#h))
  end
end

-- The state of the run at key k: a table of its fields (numbers as numbers, none as
-- false) with len (the record's length), region (its header region's) and tail (its last
-- bytes, the whole value when shorter than TAIL); nil when the key is absent; false and the
-- field that fails when it is damaged. Every field is checked.
local function stored(k)
  READ[k] = true
  local tail = redis.pcall('GETRANGE', k, TAIL_FROM, '-1')
  if type(tail) == 'table' then return false, wrong_type(tail) end
  local n = #tail
  if n == 0 then
    if redis.call('EXISTS', k) == 1 then return false, 'header' end
    return nil
  end
  local d = str_byte(tail, n) - 48
  if d < 1 or d > 6 or d + 1 > n then return false, 'header' end
  -- (Not num: the trailer's bytes are not known to be digits, as HEADER's captures are.)
  local size = decimal(str_sub(tail, n - d, n - 1), 1, MAX_HEADER)
  if not size then return false, 'header' end
  local total = n
  if n == TAIL then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  if len < 0 then return false, 'header' end
  local h
  if size + d + 1 <= n then
    h = str_sub(tail, n - size - d, n - d - 1)
  else
    h = redis.call('GETRANGE', k, len, len + size - 1)
  end
  local rev, exp, tok, cdr, cat, wk, wn, wdl, wrev, wpv, pt, tk, at, nb, px, sid, lo, lc, lw,
    pos = string.match(h, HEADER)
  if not rev then return false, 'header' end
  lo, lc, lw = num(lo, MAX_HEADER), num(lc, MAX_HEADER), num(lw, MAX_HEADER)
  if not lo or not lc or not lw then return false, 'header' end
  local rest = pos + lo + lc + lw
  if rest - 1 > size or (rest <= size and not str_find(h, '^ *$', rest)) then
    return false, 'header'
  end
  local s = {len = len, region = size, tail = n < TAIL and tail or false}
  s.rev = num(rev, MAX_INT)
  if not s.rev or s.rev < 1 then return false, 'rev' end
  if lo > 0 then
    s.own = str_sub(h, pos, pos + lo - 1)
    s.exp = num(exp, MAX_INT)
    if not s.exp then return false, 'exp' end
  else
    if exp ~= '' then return false, 'exp' end
    s.own, s.exp = false, false
  end
  s.tok = num(tok, MAX_INT)
  if s.tok == nil then return false, 'tok' end
  s.tok = s.tok or 0
  s.cat = num(cat, MAX_INT)
  if s.cat == nil then return false, 'cat' end
  if s.cat then
    s.ck = str_sub(h, pos + lo, pos + lo + lc - 1)
    s.cdr = num(cdr, MAX_INT)
    if s.cdr == nil then return false, 'cdr' end
  else
    if lc > 0 or cdr ~= '' then return false, 'cat' end
    s.ck, s.cdr = false, false
  end
  if wk ~= '' then
    s.wk = wk
    if wk == 'a' then
      if lw > 0 then return false, 'wa' end
      s.wa = false
    else
      if lw == 0 then return false, 'wa' end
      s.wa = str_sub(h, pos + lo + lc, rest - 1)
    end
    s.wn = num(wn, MAX_INT)
    if s.wn == nil or (wk ~= 'c' and not s.wn) or (wk == 'p' and s.wn < 1) then
      return false, 'wn'
    end
    s.wdl = num(wdl, MAX_INT)
    if s.wdl == nil then return false, 'wdl' end
    s.wrev, s.wpv = num(wrev, MAX_INT), num(wpv, MAX_INT)
    if not s.wrev then return false, 'wrev' end
    if not s.wpv then return false, 'wpv' end
    s.pt = num(pt, MAX_INT)
    if s.pt == nil or (s.pt and wk ~= 'p') then return false, 'pt' end
  else
    if lw > 0 or wn ~= '' or wdl ~= '' or wrev ~= '' or wpv ~= '' or pt ~= '' then
      return false, 'wk'
    end
    s.wk, s.wa, s.wn, s.wdl, s.wrev, s.wpv, s.pt = false, false, false, false, false, false,
      false
  end
  s.tk, s.at, s.nb = num(tk, MAX_TAKEOVERS), num(at, MAX_TAKEOVERS), num(nb, MAX_INT)
  if s.tk == nil then return false, 'tk' end
  if s.at == nil then return false, 'at' end
  if s.nb == nil then return false, 'nb' end
  s.tk, s.at = s.tk or 0, s.at or 0
  s.px = px ~= '' and px
  if s.px == 'p' and not s.own then return false, 'px' end
  s.sid = num(sid, MAX_INT)
  if s.sid == nil or (s.sid and (not s.own or s.sid < 1)) then return false, 'sid' end
  return s
end
