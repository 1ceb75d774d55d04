"""A script's fast path writes what its slow path would, byte for byte.

A script with a ``--- @slow`` line (redisstore/scripts.py, ``compose``) answers the common
case with a few fragments and hands every other case to its general code. Each test here
runs one random history twice, in two namespaces of one server under one controlled clock:
once with the shipped scripts, once with each fast path turned off (every call goes to the
slow path). Every reply and every key of the two namespaces must be the same, and the fast
path must have answered some of the calls (else the test proves nothing).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import fakeredis
import pytest
from servers import unique_namespace

from redisstore import (
    At,
    Changed,
    Claim,
    Free,
    Hold,
    Poll,
    RedisRunStore,
    Release,
    Seize,
    StoreError,
    Wait,
    scripts,
)
from redisstore.pytest_plugin import START, Clock

#: The scripts that have a fast path, by their attribute in redisstore.scripts.
FAST = [name for name, value in vars(scripts).items()
        if isinstance(value, scripts.Script) and name.isupper()
        and scripts.split_slow((scripts.lua_dir() / f"{value.name}.lua")
                               .read_text(encoding="utf-8"))[1] is not None]

COUNTER = "fast-count"


def variant(script: scripts.Script, fast: str) -> scripts.Script:
    """``script`` with its fast path replaced by ``fast`` (Lua, above the slow line)."""
    text = (scripts.lua_dir() / f"{script.name}.lua").read_text(encoding="utf-8")
    head = "\n".join(scripts.header_lines(text)) + "\n"
    _, slow, _ = scripts.split_slow(text)
    lib = scripts.read_lib(scripts.lua_dir(), "_lib")
    wanted = scripts.includes(script.name, text)[0]
    return scripts.compose(script.name, f"{head}{fast}{scripts.SLOW_MARK}\n{slow}", lib,
                           wanted)


def counted(script: scripts.Script) -> scripts.Script:
    """``script`` as shipped, counting its fast path's answers in P..COUNTER..name: before
    each of its lines ``return {...}`` (a fast path answers on a line of its own; it hands
    every other case to ``return SLOW()``)."""
    text = (scripts.lua_dir() / f"{script.name}.lua").read_text(encoding="utf-8")
    fast, _, _ = scripts.split_slow(text)
    body = fast[len("\n".join(scripts.header_lines(text))) + 1:]
    count = f"redis.call('INCR', P .. '{COUNTER}:{script.name}')"
    body, answers = re.subn(r"^( *)return \{", rf"\1{count}\n\1return {{", body, flags=re.M)
    assert answers, f"{script.name}: its fast path answers nothing on a line `return {{...}}`"
    return variant(script, body)


@contextmanager
def scripts_as(table: dict[str, scripts.Script]) -> Iterator[None]:
    saved = {name: getattr(scripts, name) for name in table}
    try:
        for name, value in table.items():
            setattr(scripts, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(scripts, name, value)


def discover(record: bytes) -> Wait | None:
    kind, _, arg = record.decode().partition(":")
    if kind == "dep":  # dep:a, or dep:a:<revision seen>
        dep, _, seen = arg.partition(":")
        return Changed(dep, int(seen) if seen else None)
    if kind == "poll":
        return Poll(arg, 50)
    if kind == "at":
        return At(int(arg))
    return None


RUNS = ["a", "b", "c", "d", "e"]
DAMAGED = "e"
#: A record "dep:a:now" waits for a to change from its revision when written.
RECORDS = [b"plain", b"dep:a", b"dep:b", b"dep:a:now", b"dep:b:now", b"poll:k", b"poll:j",
           b"at:0", b"at:5000000000000", b"x" * 300, b""]
OWNERS = ["n1", "n2"]


def run_value(fields: list[str], record: bytes = b"rec", pad: bytes = b"") -> bytes:
    """A layout 2 run string: the record, the header of ``fields`` (the last ones empty are
    left out as the scripts do), ``pad``, the trailer."""
    while len(fields) > 1 and fields[-1] == "":
        fields = fields[:-1]
    header = (",".join(fields) + ",").encode() + pad
    digits = str(len(header)).encode()
    return record + header + digits + str(len(digits)).encode()


def damaged(at: int, value: str) -> list[str]:
    """The header of a run at revision 1 held by n1 (expired), field ``at`` (from 0) set to
    ``value``."""
    fields = ["1", "2:n1", "99"] + [""] * 14
    fields[at] = value
    return fields


#: What an operator's hand (or a foreign client) may leave in a run's key, as (type,
#: value): a header of each malformed kind (the slow path answers CORRUPT: a fast path must
#: hand it over), valid ones a fast path leaves to the slow path (16 digits, poison, a ready
#: time), a layout 1 hash (the slow path reads it).
DAMAGE: list[tuple[str, Any]] = [
    ("string", b""),
    ("string", b"rec"),
    ("string", b"rec1,2:n1,99,91"[:-1] + b"7"),
    ("string", b"rec1,2:n1,99,91"[:-2] + b"01"),
    ("string", run_value(damaged(0, "1"), pad=b"  x")),
    ("string", run_value(damaged(0, "1"), pad=b"   ")),
    ("hash", {"rev": "1", "rec": "r", "own": "n1", "exp": "99"}),
    ("hash", {"rev": "x"}),
    ("none", None),
] + [("string", run_value(damaged(at, value))) for at, value in [
    (0, "01"), (0, "0"), (0, "x"), (0, "1000000000000000"), (1, "0:"), (1, "3:n1"),
    (1, "02:n1"), (2, ""), (2, "x"), (2, "099"), (2, "1000000000000000"), (5, "x"),
    (5, "5"), (4, "x"), (6, "z"), (6, "c"), (6, "p"), (6, "a"), (14, "x"), (14, "2147483649"),
    (14, "5"), (15, "1"), (15, "2"), (16, "5"), (16, "x")]] + [
    ("string", run_value(["1", "2:n1", "99", ck, cdr, cat])) for ck, cdr, cat in [
        ("", "", "5"), ("0:", "x", "5"), ("1:a", "3", "5"), ("1:a", "", ""), ("", "3", ""),
        ("3:a", "", "5")]] + [
    ("string", run_value(["1", "2:n1", "99", "", "", "", *wait])) for wait in [
        ("c", "", "", "", "1", "0"), ("c", "0:", "", "", "1", "0"),
        ("c", "1:a", "x", "", "1", "0"), ("c", "1:a", "", "x", "1", "0"),
        ("c", "1:a", "", "", "", "0"), ("c", "1:a", "", "", "1", "x"),
        ("p", "1:k", "0", "", "1", "0"), ("p", "1:k", "50", "", "1", "0", "0:"),
        ("p", "1:k", "50", "", "1", "0", "1:k", "x"), ("p", "1:k", "50", "", "1", "0", "1:k", "7"),
        ("a", "", "", "", "1", "0"), ("a", "1:k", "5", "", "1", "0"), ("a", "", "5", "", "1", "0"),
        ("", "1:k", "", "", "1", "0"), ("", "", "", "", "", "", "1:k")]] + [
    # Free, waiting, not in the ready index (its dependency unchanged), while the ready
    # index's directory is of another type: a Release must take it out of that index.
    ("string+Q/", run_value(["1", "", "", "", "", "", "c", "1:a", "1", "", "1", "0"])),
    ("string+Q/", run_value(["1", "", "", "", "", "", "a", "", "5000000000000", "", "1", "0"])),
    ("none", None), ("none", None), ("none", None)]


def damage(client: Any, key: str, kind: str, value: Any) -> None:
    """``key`` made of ``kind`` with ``value``: an index key is kept aside (key-saved)."""
    if kind == "index":
        if client.exists(key):
            client.rename(key, key + "-saved")
    else:
        client.delete(key)
    if kind == "hash":
        client.hset(key, mapping=value)
    elif kind != "none":
        client.set(key, value)


def restore(client: Any, key: str) -> None:
    """Index key ``key`` as it was before :func:`damage`."""
    client.delete(key)
    if client.exists(key + "-saved"):
        client.rename(key + "-saved", key)


def found(store: RedisRunStore, runs: list[str]) -> list[tuple[str, Any]]:
    """The runs of ``runs`` that get reads, with what it read."""
    out = []
    for run in runs:
        with contextlib.suppress(StoreError):
            out.append((run, store.get(run)))
    return out


def cas(rng: random.Random, store: RedisRunStore, run: str, record: bytes, owner: str,
        current: Any) -> Callable[[], Any]:
    """A compare_and_set of run, mostly by its holder at its revision."""
    holder = getattr(current.holder, "owner", owner)
    lease = rng.choice([Hold(holder)] * 6 + [Hold(owner), Claim(owner, 1_000),
                                             Seize(owner, 1_000)] + [Release()] * 3)
    if isinstance(lease, Release) and rng.random() < 0.5:
        record = b"plain"  # most releases discover no wait
    expected = current.revision - (rng.random() < 0.1)
    return partial(store.compare_and_set, run, expected, record, lease)


def history(rng: random.Random, store: RedisRunStore, clock: Clock,
            client: Any) -> Iterator[Any]:
    """One random history's calls, each yielding what it answered."""
    for run in RUNS:
        lease = rng.choice([Claim(rng.choice(OWNERS), 1_000), Release(), Hold("n1")])
        yield store.insert(run, rng.choice(RECORDS[:3]), lease)
    saved: str | None = None
    walk = itertools.count(rng.randrange(len(DAMAGE)))
    for _ in range(80):
        if saved is not None:
            restore(client, saved)  # a damaged index key is back after one call
            saved = None
        run, record, owner = rng.choice(RUNS), rng.choice(RECORDS), rng.choice(OWNERS)
        if record.endswith(b":now"):
            try:
                seen = store.get(record.split(b":")[1].decode()).revision
            except StoreError:
                seen = 0  # waits for it to be made
            # (A revision above a wait's bound, after a damaged deleted-rev: none seen.)
            record = record.replace(b":now", b":%d" % seen if seen <= 2**47 else b"")
        op = rng.random()
        call: Callable[[], Any]
        if op < 0.02:
            # An operator's hand: the meta key loses the layout (the next write records it).
            client.hdel(f"{{{store.namespace}}}:meta", "layout")
            continue
        if op < 0.11:
            # Or a run's key damaged, then written (each fast path must leave it to the
            # slow one); or an index key of another type for one write.
            prefix = f"{{{store.namespace}}}:"
            if op < 0.07:
                kind, value = DAMAGE[next(walk) % len(DAMAGE)]
                # One run only, DAMAGED, so that the others stay sound (a damaged run stays
                # so: a write over it is refused; deleted, an insert makes it anew).
                key = prefix + "r:" + DAMAGED
                for write in (partial(store.get, DAMAGED),
                              partial(store.compare_and_set, DAMAGED, 1, b"plain", Hold("n1")),
                              partial(store.compare_and_set, DAMAGED, 1, b"plain", Release()),
                              partial(store.release, "n1", [DAMAGED])):
                    damage(client, key, kind, value)
                    if kind == "string+Q/":
                        damage(client, prefix + "Q/", "index", b"x")
                    try:
                        yield write()
                    except StoreError as e:
                        yield (type(e).__name__, str(e).replace(store.namespace, "NS"))
                    if kind == "string+Q/":
                        restore(client, prefix + "Q/")
                continue
            # A held run, by its holder, without a wait: the fast paths' case.
            held = [(r, c) for r, c in found(store, RUNS) if not isinstance(c.holder, Free)]
            if not held:
                continue
            run, current = rng.choice(held)
            holder = current.holder.owner
            if rng.random() < 0.5:
                yield store.compare_and_set(run, current.revision, b"plain", Hold(holder))
                current = store.get(run)
            call = rng.choice([
                partial(store.compare_and_set, run, current.revision, b"plain", Release()),
                partial(store.compare_and_set, run, current.revision, b"plain", Hold(holder)),
                partial(store.release, holder, [run])])
            saved = prefix + rng.choice(["L/", "Q/", "L|", "Q|"])
            damage(client, saved, "index", b"x")
        elif op < 0.20:
            # An insert, mostly of a run deleted first (a new one starts above its last
            # revision); leases long enough to need no wake-up signal, or not.
            if rng.random() < 0.7:
                with contextlib.suppress(StoreError):
                    yield store.delete(run, store.get(run).revision, Release())
            meta = f"{{{store.namespace}}}:meta"
            if rng.random() < 0.2:
                # Its meta's deleted-rev damaged (or long, or valid) for this one insert.
                before = client.hget(meta, "deleted-rev")
                client.hset(meta, "deleted-rev", rng.choice(
                    ["", "x", "01", "-1", "1000000000000000", "9" * 40, "12"]))
                try:
                    yield store.insert(run, record, Claim(owner, 60_000))
                except StoreError as e:
                    yield (type(e).__name__, str(e).replace(store.namespace, "NS"))
                client.hdel(meta, "deleted-rev") if before is None else client.hset(
                    meta, "deleted-rev", before)
            lease = rng.choice([Claim(owner, 1_000), Claim(owner, 60_000), Seize(owner, 60_000),
                                Release(), Hold(owner)])
            call = partial(store.insert, run, record, lease)
        elif op < 0.72:
            try:
                current = store.get(run)
            except StoreError as e:
                yield type(e).__name__
                continue
            yield current
            call = cas(rng, store, run, record, owner, current)
        elif op < 0.83:
            # Mostly one run, by its holder: the first held one found.
            runs = rng.sample(RUNS, rng.choice([1, 1, 1, 2]))
            for candidate in rng.sample(RUNS, len(RUNS)):
                try:
                    current = store.get(candidate)
                except StoreError as e:
                    yield type(e).__name__
                    continue
                if isinstance(current.holder, Free):
                    continue
                runs[0], owner = candidate, current.holder.owner
                runs = list(dict.fromkeys(runs))
                if rng.random() < 0.7:
                    # Its last write first, mostly without a wait.
                    yield store.compare_and_set(candidate, current.revision,
                                                rng.choice([b"plain"] * 3 + [record]),
                                                Hold(owner))
                break
            call = partial(store.release, owner, runs)
        elif op < 0.89:
            call = partial(store.claim_expired, owner, 1_000, 2, max_takeovers=1)
        elif op < 0.95:
            call = partial(store.claim_ready, owner, 1_000, 2)
        else:
            clock.advance(rng.choice([10, 600, 1_000, 1_500]))
            continue
        try:
            yield call()
        except StoreError as e:
            yield (type(e).__name__, str(e).replace(store.namespace, "NS"))


def contents(client: Any, namespace: str) -> dict[str, Any]:
    """Every key of the namespace, its name relative to it, with its type and value."""
    out: dict[str, Any] = {}
    for key in client.scan_iter(match=f"{{{namespace}}}:*", count=1000):
        name = key.decode().split(":", 1)[1]
        kind = client.type(key).decode()
        read: dict[str, Callable[[Any], Any]] = {
            "string": client.get,
            "hash": client.hgetall,
            "zset": partial(client.zrange, start=0, end=-1, withscores=True),
            "set": lambda k: sorted(client.smembers(k)),
        }
        out[name] = (kind, read[kind](key))
    return out


def one_history(seed: int, clock: Clock) -> dict[str, int]:
    """Run history ``seed`` both ways and compare; how many calls each script's fast path
    answered (by its script's name)."""
    client = fakeredis.FakeRedis()
    shipped = {name: counted(getattr(scripts, name)) for name in FAST}
    slow_only = {name: variant(getattr(scripts, name), "return SLOW()\n") for name in FAST}
    answers, spaces = [], []
    for table in (shipped, slow_only):
        namespace = unique_namespace()
        store = RedisRunStore(client, namespace=namespace, discover=discover)
        store.migrate()
        with scripts_as(table):
            clock.ms = START
            # Each answer with every run's bytes after it: a difference the history later
            # overwrites (a damaged run written again) still counts.
            keys = [f"{{{namespace}}}:r:{run}" for run in RUNS]
            answers.append([(answer, client.mget(keys)) for answer in
                            history(random.Random(seed), store, clock, client)])
        spaces.append(namespace)
    assert answers[0] == answers[1], seed
    first, second = (contents(client, n) for n in spaces)
    fast = {name.split(":", 1)[1]: int(first.pop(name)[1])
            for name in list(first) if name.startswith(COUNTER + ":")}
    assert first == second, seed
    return fast


def both_ways(clock: Clock, scenario: Callable[[RedisRunStore], Any]
              ) -> tuple[dict[str, int], dict[str, Any]]:
    """``scenario`` run with the fast paths and with the slow paths only, in two namespaces:
    the same answers and keys; how many calls each fast path answered (by counter key), and
    the keys."""
    client = fakeredis.FakeRedis()
    shipped = {name: counted(getattr(scripts, name)) for name in FAST}
    slow_only = {name: variant(getattr(scripts, name), "return SLOW()\n") for name in FAST}
    spaces, answers = [], []
    for table in (shipped, slow_only):
        namespace = unique_namespace()
        store = RedisRunStore(client, namespace=namespace, discover=discover)
        store.migrate()
        with scripts_as(table):
            clock.ms = START
            answers.append(scenario(store))
        spaces.append(namespace)
    assert answers[0] == answers[1]
    first, second = (contents(client, n) for n in spaces)
    fast = {name: int(first.pop(name)[1]) for name in list(first)
            if name.startswith(COUNTER + ":")}
    assert first == second
    return fast, first


def test_a_full_bucket_splits_as_the_slow_path_splits_it(fake_clock: Clock) -> None:
    """Inserts and writes that fill the leases index's buckets past BUCKET_MAX (128): the
    fast paths leave each split to the slow path, which makes the same buckets."""

    def scenario(store: RedisRunStore) -> list[str]:
        store.insert("first", b"r", Claim("n", 60_000))
        for i in range(300):
            fake_clock.advance(1)
            store.insert(f"r{i:03}", b"r", Claim("n", 60_000))
            if i % 3 == 0:
                store.compare_and_set(f"r{i // 2:03}", 1, b"w", Release())
            if i % 5 == 1:
                store.release("n", [f"r{i - 1:03}"])
        return []

    fast, keys = both_ways(fake_clock, scenario)
    assert len([k for k in keys if k.startswith("L|")]) >= 2, "no bucket split"
    assert all(fast.get(f"{COUNTER}:{s.name}", 0) > 30 for s in (
        scripts.RUN_INSERT, scripts.RUN_COMPARE_AND_SET, scripts.RUN_RELEASE)), fast


def test_an_insert_wakes_the_runs_waiting_for_it(fake_clock: Clock) -> None:
    """A run waiting for another to be made (Changed, seen 0) is ready once it is inserted:
    an insert with waiters is the slow path's."""

    def scenario(store: RedisRunStore) -> list[Any]:
        store.insert("w", b"dep:a:0", Release())
        store.insert("x", b"plain", Claim("n", 60_000))
        store.insert("a", b"plain", Claim("n", 60_000))
        return [store.claim_ready("m", 60_000, 5)]

    fast, _ = both_ways(fake_clock, scenario)
    assert fast.get(f"{COUNTER}:run_insert") == 1, fast


@pytest.mark.parametrize("seeds", [range(k, k + 10) for k in range(0, 40, 10)],
                         ids=lambda r: f"{r.start}-{r.stop - 1}")
def test_the_fast_path_writes_what_the_slow_path_writes(seeds: range,
                                                        fake_clock: Clock) -> None:
    assert FAST, "no script has a fast path"
    took: dict[str, list[int]] = {getattr(scripts, name).name: [] for name in FAST}
    for seed in seeds:
        for name, count in one_history(seed, fake_clock).items():
            if count:
                took[name].append(seed)
    # A history where every call of a script met a case its fast path leaves to the slow
    # one (a waited-on run, a ready entry...) proves nothing about that fast path: most
    # histories must take each.
    for name, seeds_taken in took.items():
        assert len(seeds_taken) >= 7, (name, seeds_taken)
