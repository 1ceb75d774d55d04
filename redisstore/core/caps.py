"""The caps of the run scripts: ``Cap``, named once, on the ground floor.

The build writes them into the scripts (:mod:`redisstore.core.scripts`), the port checks
them (:mod:`redisstore.core.runs`, which re-exports ``Cap`` and names the public ones:
``MAX_CLAIM``...). Apart so the scripts' build need not import the port.
"""

from __future__ import annotations

from enum import IntEnum


class Cap(IntEnum):
    """The caps that keep every run script short, named here only: the build writes them
    into the scripts (``lua/_lib/``), which check them for anyone with EVALSHA, and the
    stores check them first. docs/runs.md gives each one's measured per-item cost."""

    #: Most runs one claim_ready / claim_expired hands out.
    MAX_CLAIM = 100
    #: Most index entries a claim visits beyond its limit (stale or damaged ones): a
    #: damaged one costs 10-17 µs (its quarantine), so 100 of them stay under 2 ms.
    MAX_VISIT = 100
    #: A claim's sweep of a lapsed session into the leases index goes on, in SSCAN steps of
    #: limit + MAX_VISIT runs, while it has put fewer runs than this and fewer id bytes
    #: than SESSION_SWEEP_BYTES: short ids a thousand at a time (a 10k session in due order
    #: after ten claims), ids of MAX_TEXT one step at a time (a few µs a run, a step of
    #: 200 such ids is 400 KiB).
    SESSION_SWEEP = 1000
    #: See SESSION_SWEEP.
    SESSION_SWEEP_BYTES = 32 << 10
    #: Most runs one renew or release takes: 31-40 µs each (250 took 10 ms).
    MAX_RENEW = 150
    #: Most waiters one write re-indexes; a dependency with more is finished by claims.
    MAX_FANOUT = 100
    #: Most waiters of such a dependency one claim_ready re-indexes before it claims: a
    #: waiter costs 22-64 µs, and a claim already pays for its limit of runs.
    MAX_CLAIM_FANOUT = 25
    #: The highest ``max_record_bytes`` a store takes (the scripts refuse bigger records).
    MAX_RECORD_CEILING = 2 << 20
    #: Longest id, owner, dependency or poll key, in UTF-8 bytes: a run's stored header
    #: holds several, and a claim or renew reads and writes one per run (about 2.6 µs per
    #: KiB), so 100 claims stay within a few ms.
    MAX_TEXT = 2048
    #: Keys one migration step's SCAN visits: 21-25 µs a run moved, so a step of 100-byte
    #: runs stays near 2 ms (200 took 4 ms, and up to 11 on a loaded machine).
    MAX_MIGRATE = 100
    #: Record bytes one migration step rewrites (at least one run, so any record moves).
    MAX_MIGRATE_BYTES = 512 << 10
    #: Entries (and bounds) one migration step moves out of layout 4's buckets (and
    #: directories): a bucket holds at most 128 but for foreign writes; a bigger one moves
    #: over several steps.
    MAX_MIGRATE_ENTRIES = 1024
    #: Record bytes a claim with ``records=True`` hands back: it stops before the run whose
    #: record would pass them (it always hands back at least one run, so any record comes).
    #: Copying a record into the reply costs about 1.3 ms per MiB.
    MAX_CLAIM_BYTES = 2 << 20
    #: Wake-up tokens one wake key holds (``wake-ready``, ``wake-leases``): a signal past
    #: it is coalesced into the tokens already there (each wakes one blocked claimer, and a
    #: claimer that leaves work behind signals again).
    MAX_WAKE = 256
    #: Most partitions one logical store spreads over (``partitions=N``): a claim reads
    #: every partition's head, so its cost grows with N.
    MAX_PARTITIONS = 256
    #: Most bytes of UTF-8 of a failure's error text (``Failure.error``), which the
    #: quarantine keeps beside the run.
    MAX_ERROR = 1024
    #: A run due this many ms ahead or more needs no wake-up signal when it is indexed:
    #: every blocked claim claims again within its re-arm period (``wakeups.REARM``, 10 s,
    #: shorter) and learns of it then. Saves the signal's reads on most writes (a lease of
    #: 30 s, a schedule far ahead).
    WAKE_AHEAD = 11_000
    #: The longest record a write fused with the claim after it (one script: a pipeline's
    #: finish or compare_and_set, then a claim) may carry; past it, or when the write
    #: re-indexed runs waiting on its run, the claim goes alone after it (the worst of both
    #: parts together took 11 ms, each alone under 6).
    MAX_FUSED_RECORD = 512 << 10
    #: The longest header region of a run: its numbers, and its three texts of at most
    #: MAX_TEXT bytes each. A trailer announcing more is corrupt, refused before the region
    #: is read (a planted region of 999,999 bytes cost a claim of 100 such runs 128 ms).
    MAX_HEADER = 3 * MAX_TEXT + 512
