-- keys.lua: the namespace's key names, its layouts and the limits of a number.
--
-- The run store's lib is the folder lua/_lib/, one file a concept, read in the order
-- redisstore.scripts.LIBS gives: shared fragments of the run store's scripts.
-- redisstore.scripts sends each script with the fragments it uses (a fragment is one top-level `local` definition, with
-- the comment lines right above it, up to the next one), so a script pays only for what it
-- calls.
--
-- The build (redisstore/scripts.py's docstring has it all). A script's header ends with
--   --- @include name, name, ...      (one or more lines; a bare `--- @include`: none)
-- naming every fragment of this file its body uses directly, constants and reply codes
-- too; each included fragment brings the fragments it uses, found by use (a fragment
-- declares nothing). Loading fails, listing every problem as file:line, when a body uses a
-- name it does not include, includes one it does not use or that is not here, or uses a
-- name defined nowhere; or when a fragment here uses a name defined below it (a Lua local
-- is visible only after its definition). The header's KEYS[i] lines name the keys the
-- caller sends (P.."leases"); any other key a script touches is derived from P, in the same
-- hash tag and so the same cluster slot, and listed in its `Also touches` line. The reply
-- codes OK ... TOO_NEW are generated from redisstore.scripts.Code: never define them here.
-- An error raised here reaches the caller as _lib/<file>.lua:<line>, not the composed line.
--
-- Rules every script follows:
--   Check, then write. A script does every read and every validation first and only
--   queues its writes (later); commit() sends them at the very end. Redis never rolls a
--   failed script back, so a script that returns an error or a refusal has written
--   nothing, and a runaway script stays killable (SCRIPT KILL works until the first write).
--   Trust nothing. Every ARGV number and every stored number must be a canonical decimal
--   integer in range (tonumber alone takes '0x10', ' 5 ', '1e3', 'nan'). A run whose stored
--   data fails is corrupt: the operation on it answers CORRUPT with the field; an index
--   entry that leads to a missing, wrong-type or corrupt run is moved to the quarantine
--   (hash P.."quarantine": "index|run" -> reason) and the claim goes on with the others.
--   Bounded work. Every loop visits at most a capped number of entries (see the caps).
--   ARGV[1] is the namespace's key prefix "{ns}:" (one hash tag: one cluster slot).
--   Time is read from the server (TIME), once per script and only when a decision needs it.
--
-- Replies: {code, payload, dropped, wait}. code: OK 0, NOT_FOUND 1, EXISTS 2,
-- CONFLICT 3 (payload: stored revision), REFUSED 4 (payload: {owner|false, live 0|1}),
-- CORRUPT 7 (payload: the field), TOO_NEW 8 (payload: the namespace's layout), TOO_OLD 9
-- (payload: the namespace's layout, below what the call needs), PARTITIONED 10 (payload: the
-- partition count a store of partitions recorded in this meta key, or that a partition
-- records and the caller's is not), UNCOUNTED 11 (a partition that records no count, to a
-- caller that has not checked the namespace's: nothing written). dropped:
-- index entries moved to the quarantine by this call. wait (claims only, else -1): ms until
-- the index has a claimable entry (0: now, -1: nothing indexed), see wait_after_claim. Bad arguments raise an error whose text starts
-- "BADARG" (a plain string: Redis 6.2 cannot raise a table), before anything is written.
--
-- Per-run hash P.."r:"..run (layout 1):
--   rec, rev            the record bytes and its revision
--   own, exp            lease owner and expiry (absent while free)
--   ck, cdr, cat        claim info of a ready claim: key ('' none), dependency revision
--                       ('' none), backend claim time; absent when there is none
--   wk, wa, wn, wdl     the discovered wait: kind ('c' Changed, 'p' Poll, 'a' At),
--                       dependency or poll key, seen / interval / due ('' none), deadline
--   wrev, wpv           revision and projection version the wait was derived from
--   pk, pt              the poll key whose last ready claim time pt is saved
--   tk, px              layout 3 only: takeovers since the last write (absent: 0), and
--                       1 while the run is quarantined as poison (absent: not)
-- Indexes: P.."leases" (zset run -> lease expiry, held runs only), P.."ready" (zset run ->
-- backend time the run is eligible from; free runs with a wait only), P.."d:"..dep (set of
-- runs whose wait is Changed(dep)), P.."fanout" (zset dep -> time: dependencies whose
-- waiters are still to be re-indexed, P.."fanout-cursor" their SSCAN cursors).
-- Wake-ups: P.."wake-ready" and P.."wake-leases" (zsets of at most MAX_WAKE tokens, each a
-- run id, or "#" and the SHA1 of an id longer than 64 bytes, scored by the time of the
-- signal): a write that makes a run claimable now, or due earlier than the index's head,
-- adds the run's token; a claim removes the tokens of the runs it takes and, when it leaves
-- claimable work behind, adds one. Signals are sent after the writes, each as a pcall. Blocked claimers pop them with BZPOPMIN
-- (a partition's also publish on the sharded channel of the key's name). A wake key of
-- another type only turns signals off: blocked claimers then claim again within their
-- re-arm period, as they do for writers of library versions that never signal.
-- P.."meta" (hash): layout, the namespace's layout version (absent: a new namespace, at 4,
-- unless P.."leases" or P.."ready" exists: then 1, see read_layout); deleted-rev, the
-- highest revision a deleted run had (absent: 0), above which insert starts.
--
-- The key names are defined once, in redisstore/core/keys.py (RUN_STORE_KEYS, RUN_STORE_PARTS):
-- the build writes each as a lib name ahead of this file's, a key as LEASES = P ..
-- 'leases', a part of the names built from a run, a dependency or a bound as RUN_KEY = 'r:'
-- (P .. RUN_KEY .. run). Never define or spell one here: use its name.

-- A partition of a store spread over partitions (its prefix is {ns#p}: '#' is reserved in
-- namespace names). Its dependencies in other partitions are known by a mirror, and its
-- runs that others' runs wait on announce their writes (redisstore.core.partitions,
-- docs/design/partitions.md "Dependencies across partitions"):
-- P.."depv" (hash): dependency in another partition -> its mirror entry "v|s|d": v its
-- version as last delivered here (2 * revision, plus 1 once deleted: each write of it has a
-- higher one), s the highest watch of it this entry covers, d its partition;
-- P.."unwatched" (hash): partition d -> the highest watch an unwatch begun here toward d
-- covered (a waiter's write whose watch is not above it, with no mirror entry, watches
-- again: REWATCH);
-- P.."unwatch" (sorted set): "<partition>|<run>" -> the watch to remove there (claims send
-- them: run_unwatch);
-- P.."watch:"..run (hash): partition with a run waiting on run -> its latest watch;
-- P.."watch-seq" (string): the last watch number given here (run_watch);
-- P.."outbox" (sorted set): "<partition>|<run>" -> the version of run to deliver there.
local PARTITION = string.find(P, '#', 1, true) ~= nil

-- The newest layout this library reads and writes; a namespace with a newer one is refused.
local LAYOUT = 4

-- The namespace's layout (check_layout reads it): 1, one hash per run; 2, one string per
-- run; 3, layout 2 with deletes and poison runs (tk, px, deleted-rev); 4, layout 3 with
-- bucketed indexes (see index). Every write records it (commit), so a namespace with none
-- recorded has never been written: it starts at 4, the newest (not LAYOUT: a later library
-- must still see 4 there and migrate it), and its migration is done without a SCAN of the
-- server's keys. Only a namespace that recorded an older layout needs migrate().
local NS = 4

-- Layout 4 whose migration has not yet emptied the layout 3 index keys (meta old-ix): an
-- entry may still be there, so claims read both and every removal clears both.
local OLD_IX = false

-- Exact integers in a Lua double: revisions, times, ttls and counts stay at or below it.
local MAX_INT = 9007199254740991

-- The longest ttl (2^47 ms, ~4,400 years): now + ttl stays exact.
local MAX_TTL = 140737488355328

local NOW = false
