-- old.lua: the readers of layouts 1 to 4, which only run_migrate uses (every other script
-- reads layout 5 alone and answers TOO_OLD to an older namespace).
--
-- Layout 1: one hash per run, a field each (OLD_FIELDS) and 'rec', the record. Layouts 2
-- to 4: one string per run, the record, then a header of OLD_FIELDS in order, each ended
-- by ',' (the texts length-prefixed, "6:node-a"; absent fields at the end left out; then
-- spaces where it shrank), then layout 5's trailer. Layout 3 added tk and px ('1', a
-- poison run), layout 4 rt (the ready time) and its bucketed indexes (old_index). Every
-- field is checked as that library's load checked it: a run that fails is damaged, left as
-- it is. Layout 5 is written with codec.lua's header and runs.lua's save.

-- The fields, in the header's order.
local OLD_FIELDS = {'rev', 'own', 'exp', 'ck', 'cdr', 'cat', 'wk', 'wa', 'wn', 'wdl', 'wrev',
                    'wpv', 'pk', 'pt', 'tk', 'px', 'rt'}

-- The fields stored as text ("6:node-a" in a header); the others are decimals, or the
-- letter of wk, or px's '1'.
local OLD_TEXT = {own = true, ck = true, wa = true, pk = true}

-- The longest number field (or wk, px) a layout 1 hash may hold: the old library wrote at
-- most 16 digits. A longer field, or a text longer than MAX_TEXT, is damaged (old_hash
-- sizes them before it reads them).
local OLD_NUMBER = 64

-- The longest header region of layouts 2 to 4 the old library wrote (four texts of
-- MAX_TEXT bytes with their lengths, the other fields of at most 16 digits): a longer one
-- is damaged, never read whole.
local OLD_REGION = 4 * (MAX_TEXT + 6) + #OLD_FIELDS * 17

-- The fields of an old header h as text (absent: nil), or nil and the field that is
-- malformed.
local function old_decode(h)
  local raw, pos, n = {}, 1, #h
  for i = 1, #OLD_FIELDS do
    local name, c = OLD_FIELDS[i], str_byte(h, pos)
    if c == nil or c == 32 then break end
    if OLD_TEXT[name] and c ~= 44 then
      local digits = string.match(h, '^(%d+):', pos)
      local len = decimal(digits, 0, n)
      if not len then return nil, name end
      local from = pos + #digits + 1
      raw[name] = str_sub(h, from, from + len - 1)
      pos = from + len
      if #raw[name] ~= len or str_byte(h, pos) ~= 44 then return nil, name end
    else
      local e = str_find(h, ',', pos, true)
      if not e then return nil, name end
      if e > pos then raw[name] = str_sub(h, pos, e - 1) end
      pos = e
    end
    pos = pos + 1
  end
  if pos <= n and not str_find(h, '^ *$', pos) then return nil, 'header' end
  return raw
end

-- The bytes a layout 1 hash takes beyond its record, at most, when its fields are of the
-- sizes the old library wrote (the texts of MAX_TEXT bytes, room for each field's keeping).
local OLD_HASH = 4 * MAX_TEXT + 4096

-- The raw fields of the layout 1 run at hash key k (text; absent: nil), with len and size,
-- its record's length; false and the field when one is longer than the old library wrote, rev
-- is absent or rec is. The fields are sized before they are read: the whole hash at once
-- (MEMORY USAGE, O(fields)), else, when it is bigger (or the server denies the command),
-- one by one.
local function old_hash(k)
  local size = redis.call('HSTRLEN', k, 'rec')
  local m = redis.call('HLEN', k) <= 2 * #OLD_FIELDS
    and redis.pcall('MEMORY', 'USAGE', k, 'SAMPLES', 0)
  if type(m) ~= 'number' or m > size + OLD_HASH then
    for _, name in ipairs(OLD_FIELDS) do
      if redis.call('HSTRLEN', k, name) > (OLD_TEXT[name] and MAX_TEXT or OLD_NUMBER) then
        return false, name
      end
    end
  end
  local v = redis.call('HMGET', k, unpack(OLD_FIELDS))
  for i, name in ipairs(OLD_FIELDS) do
    if v[i] and #v[i] > (OLD_TEXT[name] and MAX_TEXT or OLD_NUMBER) then return false, name end
  end
  if not v[1] then return false, 'rev' end
  if size == 0 and redis.call('HEXISTS', k, 'rec') == 0 then return false, 'rec' end
  local raw = {len = size, size = size}
  for i = 1, #OLD_FIELDS do raw[OLD_FIELDS[i]] = v[i] or nil end
  return raw
end

-- The raw fields of the run of layouts 2 to 4 at string key k, with len (its record's
-- length), region and size (its header region's length); true when it is in layout 5
-- already: its header's numbers read as HEADER's (an old header never does: its first ':'
-- comes after at most 12 commas, layout 5's after 18); false and the field when damaged.
local function old_string(k)
  local tail = redis.call('GETRANGE', k, TAIL_FROM, '-1')
  local n = #tail
  if n == 0 then return false, 'header' end
  local d = str_byte(tail, n) - 48
  if d < 1 or d > 6 or d + 1 > n then return false, 'header' end
  local size = decimal(str_sub(tail, n - d, n - 1), 1, MAX_HEADER)
  if not size then return false, 'header' end
  local total = n
  if n == TAIL then total = redis.call('STRLEN', k) end
  local len = total - size - d - 1
  if len < 0 then return false, 'header' end
  -- The first bytes of the region: its whole when the old library could have written it,
  -- else only what holds layout 5's numbers.
  local upto = size <= OLD_REGION and size or math.min(size, 320)
  local h
  if size + d + 1 <= n then
    h = str_sub(tail, n - size - d, n - size - d + upto - 1)
  else
    h = redis.call('GETRANGE', k, len, len + upto - 1)
  end
  if string.match(h, HEADER) then return true end
  if upto < size then return false, 'header' end
  local raw, bad = old_decode(h)
  if not raw then return false, bad end
  raw.len, raw.region, raw.size = len, size, size
  return raw
end

-- The layout 5 state of the old run raw (fields as text), checked as the old library
-- checked them, or false and the field that fails. A held run gets grant token 1 (the old
-- library gave none), attempts 0 and no not_before; the poll time is kept while the poll
-- key it was taken for is the wait's; a poison mark is 'p' (only a held run has one: the
-- old library cleared it with the lease); layout 4's ready time goes (layout 5 keeps none).
local function old_state(raw)
  local rev = decimal(raw.rev, 1, MAX_INT)
  if not rev then return false, 'rev' end
  local own, exp = raw.own or false, false
  if own then
    if own == '' then return false, 'own' end
    exp = decimal(raw.exp, 0, MAX_INT)
    if not exp then return false, 'exp' end
  end
  local s = fresh(own and 1 or 0)
  s.rev, s.own, s.exp = rev, own, exp
  if raw.cat then
    s.cat = decimal(raw.cat, 0, MAX_INT)
    if not s.cat then return false, 'cat' end
    s.cdr = opt_decimal(raw.cdr or '', 0, MAX_INT)
    if s.cdr == nil then return false, 'cdr' end
    s.ck = raw.ck or ''
  end
  local wk = raw.wk
  if wk then
    if wk ~= 'c' and wk ~= 'p' and wk ~= 'a' then return false, 'wk' end
    if wk ~= 'a' and (not raw.wa or raw.wa == '') then return false, 'wa' end
    s.wk, s.wa = wk, wk ~= 'a' and raw.wa
    if wk == 'c' then
      s.wn = opt_decimal(raw.wn or '', 0, MAX_INT)
    else
      s.wn = decimal(raw.wn, wk == 'p' and 1 or 0, MAX_INT)
    end
    if s.wn == nil then return false, 'wn' end
    s.wdl = opt_decimal(raw.wdl or '', 0, MAX_INT)
    if s.wdl == nil then return false, 'wdl' end
    s.wrev = decimal(raw.wrev, 0, MAX_INT)
    if not s.wrev then return false, 'wrev' end
    s.wpv = decimal(raw.wpv, 0, MAX_INT)
    if not s.wpv then return false, 'wpv' end
    if raw.pk == '' then return false, 'pk' end
    local pt = opt_decimal(raw.pt or '', 0, MAX_INT)
    if pt == nil then return false, 'pt' end
    if wk == 'p' and raw.pk == raw.wa then s.pt = pt end
  end
  s.tk = decimal(raw.tk or '0', 0, MAX_TAKEOVERS)
  if not s.tk then return false, 'tk' end
  if raw.px and raw.px ~= '1' then return false, 'px' end
  if raw.px and own then s.px = 'p' end
  if opt_decimal(raw.rt or '', 0, MAX_INT) == nil then return false, 'rt' end
  return s
end

-- The run index a key of layout 4's indexes belongs to, named by rest (what follows P):
-- LEASES_IX, READY_IX or a dependency's waiters (deps_ix), and true for its directory, or
-- false and the bucket's bound; nil for any other key. A dependency's keys hold its length,
-- so its name is read back whole, whatever bytes it has.
local function old_index(rest)
  local c, at = str_sub(rest, 1, 1), 2
  local ix
  if c == LEASES_BUCKETS then
    ix = LEASES_IX
  elseif c == READY_BUCKETS then
    ix = READY_IX
  elseif c == DEPS_BUCKETS then
    local digits = string.match(rest, '^(%d+)', 2)
    local n = decimal(digits, 1, MAX_TEXT)
    if not n or str_sub(rest, 2 + #digits, 1 + #digits + #DEPS_SEP) ~= DEPS_SEP then
      return nil
    end
    at = 2 + #digits + #DEPS_SEP + n
    ix = deps_ix(str_sub(rest, at - n, at - 1))
  else
    return nil
  end
  local mark = str_sub(rest, at, at + #BUCKET_DIR - 1)
  if mark == BUCKET_DIR and #rest == at + #BUCKET_DIR - 1 then return ix, true end
  if str_sub(rest, at, at + #BUCKET_AT - 1) == BUCKET_AT then
    return ix, false, str_sub(rest, at + #BUCKET_AT)
  end
  return nil
end
