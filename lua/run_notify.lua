-- run_notify: deliver a dependency's version from its partition's outbox: raise the mirror
-- of it here and, when it rose, re-index this partition's runs waiting on it (as its own
-- write would, up to MAX_FANOUT, the rest by claims). Safe to repeat: a version at or below
-- the mirror's changes nothing. A dependency no run here waits on any more is unwatched
-- instead (its mirror entry goes, the unwatch is queued for d: see unwatch).
-- KEYS[1]  P.."meta"
-- KEYS[2]  P.."fanout"
-- ARGV[1]  key prefix (a partition's, {ns#p}:)            ARGV[2] the dependency
-- ARGV[3]  its version (2 * revision, plus 1 once deleted)  ARGV[4] caller's projection version
-- ARGV[5]  optional: the dependency's partition d            ARGV[6] the watch of this
--          partition there as the claim read it (0: none)
-- Reply    {OK, 1 when the mirror rose else 0} | {CORRUPT, field} | {TOO_NEW, layout}
--          | {TOO_OLD, layout}
-- Also touches, undeclared (same hash tag): P.."depv", P.."d:"..dep and the P.."r:" of its
-- waiters (re-indexed), P.."fanout-cursor", P.."quarantine", P.."wake-ready" (signals),
-- P.."unwatched" and P.."unwatch" (an unwatch begun).
--- @include CORRUPT, OK, MAX_PARTITIONS, arg_int, FANOUT, PARTITION, MAX_INT, arg_text
--- @include of_type, commit, check_layout, raise_mirror, notify_dependents, mirror_of, idle
--- @include unwatch
local dep = arg_text(2)
local v = arg_int(3, 0, MAX_INT)
local pv = arg_int(4, 0, 2147483648)
local d, seq = false, 0
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  d, seq = arg_int(5, 0, MAX_PARTITIONS - 1), arg_int(6, 0, MAX_INT)
end
if not PARTITION then error('BADARG ARGV[1] must be the prefix of a partition, {ns#p}:') end
local bad_layout = check_layout()
if bad_layout then return bad_layout end
if not of_type(FANOUT, 'zset') then return {CORRUPT, 'index:fanout', 0, -1} end
local rose = false
if d and idle(dep, nil) then
  -- Nobody here waits on it: nothing to raise, the watch goes (the highest number known).
  local m = mirror_of(dep)
  unwatch(dep, d, math.max(seq, m and m.s or 0))
else
  rose = raise_mirror(dep, v, seq, d)
  if rose then notify_dependents(dep, pv) end
end
local bad_write = commit()
if bad_write then return {CORRUPT, bad_write, 0, -1} end
return {OK, rose and 1 or 0, 0, -1}
