"""A script's fast path writes what its general code would, byte for byte.

A script with a ``--- @slow`` line (redisstore/core/scripts.py, ``compose``; lua/_lib/lean.lua)
answers the common case with a few functions and hands every other case, before it writes
anything, to its general code. Each test here runs one random history twice, in two
namespaces of one server under one controlled clock: once with the shipped scripts, once
with every fast path turned off (each call goes to the general code). Every reply, every
run's bytes after each call and every key at the end must be the same, and each fast path
must have answered some of the calls (else the test proves nothing).
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import fakeredis
import pytest
import redis
from servers import SUITE_TIMEOUT, unique_namespace

from redisstore import (
    At,
    Changed,
    Claim,
    Fenced,
    Free,
    Hold,
    Poll,
    RedisRunStore,
    Release,
    Seize,
    StoreError,
    Wait,
)
from redisstore.core import runops, scripts
from redisstore.pytest_plugin import START, Clock

#: The scripts that have a fast path, by their attribute in redisstore.core.scripts.
FAST = [name for name, value in vars(scripts).items()
        if isinstance(value, scripts.Script) and name.isupper()
        and scripts.split_slow((scripts.lua_dir() / f"{value.name}.lua")
                               .read_text(encoding="utf-8"))[1] is not None]

COUNTER = "fast-count"
LONG = 60_000  # a lease the fast paths take (at least WAKE_AHEAD)
SHORT = 1_000  # one they leave to the general code (it may signal)


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
    each line of its fast path that answers (``return reply`` or ``return {...}``)."""
    text = (scripts.lua_dir() / f"{script.name}.lua").read_text(encoding="utf-8")
    fast, _, _ = scripts.split_slow(text)
    body = fast[len("\n".join(scripts.header_lines(text))) + 1:]
    count = f"redis.call('INCR', P .. '{COUNTER}:{script.name}')"
    body, answers = re.subn(r"^( *)return (reply|\{)", rf"\1{count}\n\1return \2", body,
                            flags=re.M)
    assert answers, f"{script.name}: its fast path answers on no line `return reply`"
    return variant(script, body)


@contextmanager
def scripts_as(table: dict[str, scripts.Script]) -> Iterator[None]:
    """The scripts of ``table`` (by attribute name) in place of the shipped ones, in
    redisstore.core.scripts and in the core's table of fused scripts."""
    saved = {name: getattr(scripts, name) for name in table}
    fused = dict(runops.FUSED)
    try:
        for name, value in table.items():
            setattr(scripts, name, value)
            for first, script in fused.items():
                if script.name == value.name:
                    runops.FUSED[first] = value
        yield
    finally:
        for name, value in saved.items():
            setattr(scripts, name, value)
        runops.FUSED.clear()
        runops.FUSED.update(fused)


def discover(record: bytes) -> Wait | None:
    kind, _, arg = record.decode().partition(":")
    if kind == "dep":
        return Changed(arg)
    if kind == "poll":
        return Poll(arg, 50)
    if kind == "at":
        return At(START + int(arg))
    return None


RUNS = ["a", "b", "c", "d", "e"]
DAMAGED = "e"
#: Records: due now, due far ahead (no signal), soon (a signal: the general code's), done,
#: a dependency's and a poll key's (the general code's), a long one, an empty one.
RECORDS = [b"at:-5", b"at:0", b"at:600000", b"at:2000", b"plain", b"dep:a", b"poll:k",
           b"x" * 300, b""]
OWNERS = ["n1", "n2"]

#: What an operator's hand (or a foreign client) may leave in a run's key: a header of
#: each malformed kind (the general code answers CORRUPT or quarantines: a fast path must
#: hand it over), and valid ones a fast path leaves to the general code (16 digits, a
#: quarantine mark, a layout 4 header, a hash).
DAMAGE: list[tuple[str, Any]] = [
    ("string", b""),
    ("string", b"rec"),
    ("string", b"rec1,,,,,a,0,,1,1,,,,,,,0,0,0:252"),  # a header of 25 bytes said, 24 there
    ("string", b"rec01,,,,,a,0,,01,1,,,,,,,0,0,0:252"),
    ("string", b"rec1,,,,,a,0,,1,1,,,,,,,0,0,0:  x283"),
    ("string", b"rec1,,,,,a,0,,1,1,,,,,,,0,0,0:   283"),
    ("string", b"rec1,,,,,a,00,,1,1,,,,,,,0,0,0:262"),
    ("string", b"rec1,,,,,a,1000000000000000,,1,1,,,,,,,0,0,0:402"),
    ("string", b"rec1,,,,,a,0,,1,1,,,,,f,,0,0,0:262"),
    ("string", b"rec1,,,,,a,0,,1,1,,,,,,7,0,0,0:262"),
    ("string", b"rec1,,,,,a,0,,1,1,,2147483649,,,,,0,0,0:352"),
    ("string", b"rec1,99,,,,a,0,,1,1,,,,,,,0,0,0:282"),
    ("string", b"rec1,,,,,,0,,1,1,,,,,,,0,0,0:252"),
    ("string", b"rec1,,,,,a,0,,1,1,,,,,,,0,0,1:k262"),
    ("string", b"rec1,6:n1,99,,,,,,,,,,,252"),  # layout 4's header
    ("hash", {"rev": "1", "rec": "r", "own": "n1", "exp": "99"}),
    ("none", None),
]


def damage(client: Any, key: str, kind: str, value: Any) -> None:
    client.delete(key)
    if kind == "hash":
        client.hset(key, mapping=value)
    elif kind != "none":
        client.set(key, value)


def found(store: RedisRunStore, runs: list[str]) -> list[tuple[str, Any]]:
    out = []
    for run in runs:
        with contextlib.suppress(StoreError):
            out.append((run, store.get(run)))
    return out


def failed(e: StoreError, store: RedisRunStore) -> tuple[str, str]:
    return type(e).__name__, str(e).replace(store.namespace, "NS")


def pipelined(store: RedisRunStore, first: Callable[[Any], Any], claim: Callable[[Any], Any]
              ) -> list[Any]:
    """A pipeline of ``first`` and the claim after it (fused where they fuse): each call's
    answer, or its error."""
    with store.pipeline() as pipe:
        one, two = first(pipe), claim(pipe)
    out = []
    for pending in (one, two):
        try:
            out.append(pending.result())
        except StoreError as e:
            out.append(failed(e, store))
    return out


def finish_in(pipe: Any, *, run: str, revision: int, lease: Fenced, record: bytes) -> Any:
    return pipe.finish(run, revision, lease, record=record)


def cas_in(pipe: Any, *, run: str, revision: int, record: bytes, lease: Any) -> Any:
    return pipe.compare_and_set(run, revision, record, lease)


def settled(got: Any, store: RedisRunStore) -> Any:
    """A Settled's value, or its error as :func:`failed` gives it."""
    return got.value if got.error is None else failed(got.error, store)


def session_fused(store: RedisRunStore, run: str, revision: int, lease: Fenced,
                  record: bytes, session: str, claim: tuple[int, bool, int | None]
                  ) -> list[Any]:
    """A finish and the next claim under ``session`` in one script, as a Worker on sessions
    sends them (the pipeline API has no session claim): each one's answer."""
    limit, records, bound = claim
    ops = store._ops
    assert isinstance(ops, runops.RunOps)
    first = ops.finish(run, revision, lease, record=record)
    call = next(first)
    then = ops.session_claim("any", session, lease.owner, LONG, limit, records, bound)
    then_call = next(then)
    if not runops.fusable(call, then_call):
        return ["unfused"]
    try:
        one, two = store._write(runops.fused((first, call), (then, then_call)))
    except StoreError as e:
        return [failed(e, store)]
    return [settled(one, store), settled(two, store)]


def a_session_claim(rng: random.Random, session: str, owner: str
                    ) -> Callable[[RedisRunStore], Any]:
    """A claim under ``session`` of owner, of some kind."""
    limit = rng.choice([1, 1, 2, 3])
    records = rng.random() < 0.6
    bound = rng.choice([None, None, 0, 1])
    kind = rng.choice(["any", "any", "ready", "leases"])
    return lambda s: s._session_claim(kind, session, owner, LONG, limit, records, 0, bound)


def a_claim(rng: random.Random, owner: str) -> Callable[[Any], Any]:
    """A claim of some kind, mostly as the fast paths take it."""
    ttl = rng.choice([LONG] * 4 + [SHORT])
    limit = rng.choice([1, 1, 2, 3])
    records = rng.random() < 0.6
    bound = rng.choice([None, None, 0, 1])
    kind = rng.choice(["claim", "claim", "claim_ready", "claim_expired"])
    if kind == "claim_ready":
        return lambda s: s.claim_ready(owner, ttl, limit, records=records)
    return lambda s: getattr(s, kind)(owner, ttl, limit, records=records,
                                      max_takeovers=bound)


def raw_call(client: Any, store: RedisRunStore, name: str, keys: tuple[str, ...],
             *args: Any) -> Any:
    """Script ``name`` (its attribute in redisstore.core.scripts: the variant in place) sent by
    EVALSHA with ``keys`` (names after the prefix) and ``args`` after the prefix: its
    reply, or its error (the namespace written NS)."""
    script = getattr(scripts, name)
    prefix = f"{{{store.namespace}}}:"
    client.script_load(script.source)
    try:
        return client.evalsha(script.sha, len(keys), *(prefix + k for k in keys), prefix,
                              *args)
    except redis.ResponseError as e:
        return "error", str(e).replace(store.namespace, "NS")


@contextmanager
def damaged_index(client: Any, store: RedisRunStore, name: str) -> Iterator[None]:
    """The index key ``name`` of another type (a string) while the block runs, then as it
    was."""
    key, aside = (f"{{{store.namespace}}}:{n}" for n in (name, "aside"))
    had = client.exists(key)
    if had:
        client.rename(key, aside)
    client.set(key, "not an index")
    try:
        yield
    finally:
        client.delete(key)
        if had:
            client.rename(aside, key)


@contextmanager
def damaged_floor(client: Any, store: RedisRunStore, value: str) -> Iterator[None]:
    """The meta's deleted-rev (or deleted-tok) planted as ``value`` (damaged, or a floor
    the store never wrote) while the block runs, then as it was."""
    meta = f"{{{store.namespace}}}:meta"
    field = "deleted-rev" if value.startswith("r") else "deleted-tok"
    old = client.hget(meta, field)
    client.hset(meta, field, value[1:])
    try:
        yield
    finally:
        if old is None:
            client.hdel(meta, field)
        else:
            client.hset(meta, field, old)


def planted(damage: contextlib.AbstractContextManager[None], call: Callable[[], Any],
            store: RedisRunStore) -> Any:
    """``call``'s answer, or its error, made while ``damage`` holds."""
    with damage:
        try:
            return call()
        except StoreError as e:
            return failed(e, store)


#: What a history may plant in the meta's floor for one insert: damaged values (the
#: general code answers CORRUPT) and sound ones (the fast path's).
FLOORS = ["r", "r01", "r" + "1" * 17, "rx", "t", "t0", "t07", "r7", "t12", "r0"]


def history(rng: random.Random, store: RedisRunStore, clock: Clock,
            client: Any, with_sessions: bool = False) -> Iterator[Any]:
    """One random history's calls, each yielding what it answered; ``with_sessions``, with
    each owner's session too (its claims, keepalives, finishes fused with its claims)."""
    pv = 1  # the store's projection version (its default)
    # Each owner's session (opened again by an op below once it lapsed): the Worker's way.
    sessions = ({owner: store.open_session(owner, LONG).id for owner in OWNERS}
                if with_sessions else {})
    for run in RUNS:
        lease = rng.choice([Claim(rng.choice(OWNERS), LONG), Release(), Release()])
        yield store.insert(run, rng.choice(RECORDS[:3]), lease)
    for _ in range(80):
        run, record, owner = rng.choice(RUNS), rng.choice(RECORDS), rng.choice(OWNERS)
        op = rng.random()
        call: Callable[[], Any]
        if op < 0.05:
            # A run's key damaged (DAMAGED only, so that the others stay sound), then met
            # by a claim: the general code's, whatever the fast path would do.
            kind, value = DAMAGE[rng.randrange(len(DAMAGE))]
            key = f"{{{store.namespace}}}:r:{DAMAGED}"
            damage(client, key, kind, value)
            client.zadd(f"{{{store.namespace}}}:" + rng.choice(["ready", "leases"]),
                        {DAMAGED: START - 10})
            call = partial(a_claim(rng, owner), store)
        elif op < 0.13:
            with contextlib.suppress(StoreError):
                yield store.delete(run, store.get(run).revision, Release())
            lease = rng.choice([Claim(owner, SHORT), Claim(owner, LONG), Claim(owner, LONG),
                                Release(), Release(), Hold(owner), Seize(owner, LONG)])
            insert = partial(store.insert, run, record, lease)
            call = insert
            if rng.random() < 0.15:
                # Its meta's floor planted for this insert only.
                call = partial(planted, damaged_floor(client, store, rng.choice(FLOORS)),
                               insert, store)
        elif op < 0.49:
            # A held run finished and the next claimed, as the worker does: by a finish
            # with a record (fused), a compare_and_set under Release (fused), mostly of its
            # own grant; or its claim alone.
            held = [(r, c) for r, c in found(store, RUNS) if not isinstance(c.holder, Free)]
            if not held or rng.random() < 0.2:
                call = partial(a_claim(rng, owner), store)
            elif with_sessions and rng.random() < 0.3:
                # A finish and a claim under the holder's session, fused (a Worker on
                # sessions): most runs it finishes were taken under that session.
                run, current = rng.choice(held)
                holder = current.holder.owner
                token = current.token if rng.random() < 0.9 else (current.token or 0) + 1
                call = partial(session_fused, store, run,
                               current.revision - (rng.random() < 0.05),
                               Fenced(holder, token or 1),
                               rng.choice([b"plain", b"at:-5", record]), sessions[holder],
                               (rng.choice([1, 1, 2]), rng.random() < 0.6,
                                rng.choice([None, 0, 1])))
            else:
                run, current = rng.choice(held)
                holder = current.holder.owner
                token = current.token if rng.random() < 0.9 else (current.token or 0) + 1
                revision = current.revision - (rng.random() < 0.05)
                how = rng.random()
                # Mostly a result that frees the run, or one ready again at once, as a
                # worker's finish and retry write them.
                record = rng.choice([b"plain", b"at:-5", record])
                first: Callable[[Any], Any]
                if how < 0.5:
                    first = partial(finish_in, run=run, revision=revision,
                                    lease=Fenced(holder, token), record=record)
                else:
                    lease = Release() if how < 0.75 else Fenced(holder, token, release=True)
                    first = partial(cas_in, run=run, revision=revision, record=record,
                                    lease=lease)
                call = partial(pipelined, store, first, a_claim(rng, holder))
                if how < 0.2:
                    # The finish alone, as an AsyncWorker's loops send theirs at
                    # concurrency (their claims go together).
                    call = partial(store.finish, run, revision, Fenced(holder, token),
                                   record=record)
        elif op < 0.57:
            try:
                current = store.get(run)
            except StoreError as e:
                yield failed(e, store)
                continue
            holder = getattr(current.holder, "owner", owner)
            token = current.token if rng.random() < 0.9 else (current.token or 0) + 1
            lease = rng.choice([Hold(holder), Hold(holder), Release(), Release(),
                                Fenced(holder, token or 1),
                                Fenced(holder, token or 1, release=True),
                                Seize(owner, LONG), Claim(owner, SHORT)])
            call = partial(store.compare_and_set, run, current.revision, record, lease)
        elif op < 0.71:
            # A release or renew, mostly of runs the owner holds (as a worker sends them).
            held = [r for r, c in found(store, RUNS)
                    if getattr(c.holder, "owner", None) == owner]
            runs = rng.sample(RUNS, rng.choice([1, 1, 2, 3]))
            if held and rng.random() < 0.7:
                runs = rng.sample(held, min(len(held), rng.choice([1, 1, 2, 3])))
            if op < 0.64:
                call = partial(store.release, owner, runs)
            else:
                call = partial(store.renew, owner, runs, rng.choice([LONG, LONG, SHORT]))
        elif op < 0.74:
            # Raw calls the store never sends: a run named twice; a projection version
            # above the runs' (their waits stale).
            runs = rng.sample(RUNS, rng.choice([1, 2]))
            runs += rng.sample(runs, rng.choice([0, 1]))
            if rng.random() < 0.5:
                call = partial(raw_call, client, store, "RUN_RENEW", ("leases", "meta"),
                               owner, LONG, *runs)
            else:
                call = partial(raw_call, client, store, "RUN_RELEASE",
                               ("leases", "ready", "meta"), owner, rng.choice([pv, pv + 1]),
                               *runs)
        elif op < 0.77:
            # An index key of another type met by a write: CORRUPT, nothing written.
            held = [r for r, c in found(store, RUNS) if not isinstance(c.holder, Free)]
            name = rng.choice(["leases", "ready"])
            writes: list[Callable[[], Any]] = [
                partial(store.release, owner, [run]),
                partial(store.renew, owner, held or [run], LONG),
                partial(store.insert, "new", record, rng.choice([Release(),
                                                                 Claim(owner, LONG)]))]

            call = partial(planted, damaged_index(client, store, name), rng.choice(writes),
                           store)
        elif (op < 0.88 and not with_sessions) or op < 0.83:
            call = partial(a_claim(rng, owner), store)
        elif op < 0.86:
            call = partial(a_session_claim(rng, sessions[owner], owner), store)
        elif op < 0.88:
            # A session that lapsed (the clock's long steps) opened again; else a keepalive.
            try:
                yield store._session_keepalive(sessions[owner], owner)
            except StoreError as e:
                yield failed(e, store)
                sessions[owner] = store.open_session(owner, LONG).id
            continue
        else:
            clock.advance(rng.choice([10, 600, 1_000, 2_500, 70_000]))
            continue
        try:
            yield call()
        except StoreError as e:
            yield failed(e, store)


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
            "list": partial(client.lrange, start=0, end=-1),
        }
        out[name] = (kind, read[kind](key))
    return out


def one_history(seed: int, clock: Clock, with_sessions: bool = False) -> dict[str, int]:
    """Run history ``seed`` both ways and compare; how many calls each script's fast path
    answered (by its script's name)."""
    client = fakeredis.FakeRedis()
    shipped = {name: counted(getattr(scripts, name)) for name in FAST}
    general = {name: variant(getattr(scripts, name), "") for name in FAST}
    answers, spaces = [], []
    for table in (shipped, general):
        namespace = unique_namespace()
        # A long deadline: each history's first calls load its variants' big scripts into
        # fakeredis (a compile each), which took over the default 5 s under a loaded CI.
        store = RedisRunStore(client, namespace=namespace, discover=discover,
                              timeout=SUITE_TIMEOUT)
        with scripts_as(table):
            clock.ms = START
            # Each answer with every run's bytes after it: a difference the history later
            # overwrites still counts.
            keys = [f"{{{namespace}}}:r:{run}" for run in RUNS]
            answers.append([(answer, client.mget(keys)) for answer in
                            history(random.Random(seed), store, clock, client,
                                    with_sessions)])
        spaces.append(namespace)
    for i, (a, b) in enumerate(zip(*answers, strict=True)):
        assert a == b, (seed, i)
    first, second = (contents(client, n) for n in spaces)
    fast = {name.split(":", 1)[1]: int(first.pop(name)[1])
            for name in list(first) if name.startswith(COUNTER + ":")}
    assert first == second, seed
    return fast


@pytest.mark.parametrize("seeds", [range(k, k + 10) for k in range(0, 40, 10)],
                         ids=lambda r: f"{r.start}-{r.stop - 1}")
def test_the_fast_path_writes_what_the_general_code_writes(seeds: range,
                                                           fake_clock: Clock) -> None:
    # The three claims, the two fused writes and claims; finish, compare_and_set, get,
    # renew, release, insert.
    assert len(FAST) == 11, FAST
    took: dict[str, list[int]] = {getattr(scripts, name).name: [] for name in FAST}
    for seed in seeds:
        for name, count in one_history(seed, fake_clock).items():
            if count:
                took[name].append(seed)
    # A history where every call of a script met a case its fast path leaves to the
    # general code proves nothing about that fast path: most histories must take each.
    for name, seeds_taken in took.items():
        assert len(seeds_taken) >= 5, (name, seeds_taken)



def test_the_fast_path_writes_what_the_general_code_writes_under_sessions(
        fake_clock: Clock) -> None:
    """Histories with each owner's session (its claims, and finishes fused with its claims,
    as a Worker on sessions sends them; sessions that lapse and are opened again): the fast
    paths that take a session's runs write what the general code does."""
    took: dict[str, list[int]] = {getattr(scripts, name).name: [] for name in FAST}
    for seed in range(100, 110):
        for name, count in one_history(seed, fake_clock, with_sessions=True).items():
            if count:
                took[name].append(seed)
    for name in ("run_claim", "run_finish_claim", "run_finish"):
        assert len(took[name]) >= 5, (name, took[name])


def _fast_answers(client: Any, namespace: str) -> dict[str, int]:
    return {key.decode().split(":", 2)[2]: int(client.get(key))
            for key in client.scan_iter(f"{{{namespace}}}:{COUNTER}:*")}


@pytest.mark.parametrize("over", ["ready", "expired", "both"])
def test_the_common_claims_take_the_fast_path(over: str, fake_clock: Clock) -> None:
    """The cases a worker meets most are answered by the fast path, every call: a claim of
    each kind over ready runs, over expired leases (the other index empty), over both; a
    finish with the claim of the next in one script; a get, a renew and a release of one
    held run, an insert of a new one. (The equivalence test above proves a fast path right
    wherever it answers, not that it answers where it should: a claim over expired leases
    with no ready index went to the general code every time.)"""
    client = fakeredis.FakeRedis()
    namespace = unique_namespace()
    store = RedisRunStore(client, namespace=namespace, discover=discover,
                              timeout=SUITE_TIMEOUT)
    runs = [f"{i:032x}" for i in range(12)]
    for n, run in enumerate(runs):
        lease = Release() if over == "ready" or (over == "both" and n % 2) else Claim("n", 1)
        store.insert(run, b"at:-5", lease)  # ready since 5 ms ago
    fake_clock.advance(10)  # the 1 ms leases ran out
    shipped = {name: counted(getattr(scripts, name)) for name in FAST}
    with scripts_as(shipped):
        calls = {"run_claim": 0}
        for _ in range(3):
            assert len(store.claim("m", LONG, 1)) == 1
            calls["run_claim"] += 1
        kind = {"ready": "claim_ready", "expired": "claim_expired"}.get(over)
        if kind is not None:
            assert len(getattr(store, kind)("m", LONG, 1)) == 1
            calls[f"run_{kind}"] = 1
        (got,) = store.claim("m", LONG, 1, records=True)
        calls["run_claim"] += 1
        for _ in range(3):
            with store.pipeline() as pipe:
                done = finish_in(pipe, run=got.run, revision=got.current.revision,
                                 lease=Fenced("m", got.current.token or 0), record=b"plain")
                nxt = pipe.claim("m", LONG, records=True)
            done.result()
            (got,) = nxt.result()
        calls["run_finish_claim"] = 3
        # A finish alone (an AsyncWorker's at concurrency), of a run held under a lease of
        # its own and of one held under a session.
        store.finish(got.run, got.current.revision, Fenced("m", got.current.token or 0),
                     record=b"plain")
        session = store.open_session("m", LONG)
        (got,) = session.claim(records=True)
        store.finish(got.run, got.current.revision, Fenced("m", got.current.token or 1),
                     record=b"plain")
        calls.update(run_finish=2, run_claim=calls["run_claim"] + 1)
        (got,) = store.claim("m", LONG, 1, records=True)
        calls["run_claim"] += 1
        # The single-run calls: a get, a renew and a release of one held run (its At
        # wait due: it is ready again, with a signal), an insert with a lease and one
        # ready now.
        assert store.get(got.run).revision == got.current.revision
        assert store.renew("m", [got.run], LONG) == [got.run]
        assert store.release("m", [got.run]) == [got.run]
        store.insert("new", b"plain", Claim("m", LONG))
        store.insert("new-ready", b"at:-5", Release())
        calls.update(run_get=1, run_renew=1, run_release=1, run_insert=2)
    assert _fast_answers(client, namespace) == calls


def test_the_common_writes_take_the_fast_path(fake_clock: Clock) -> None:
    """compare_and_set as a worker and an engine send it, each call on the fast path: a
    checkpoint under Hold and under Fenced (the lease kept), a Fenced write that frees the
    run, and Release of a free run whose new wait is due now (with its wake-up signal)."""
    client = fakeredis.FakeRedis()
    namespace = unique_namespace()
    store = RedisRunStore(client, namespace=namespace, discover=discover,
                              timeout=SUITE_TIMEOUT)
    store.insert("w", b"plain", Release())
    store.insert("h", b"plain", Claim("m", LONG))
    shipped = {name: counted(getattr(scripts, name)) for name in FAST}
    with scripts_as(shipped):
        current = store.get("h")
        token = current.token or 0
        store.compare_and_set("h", current.revision, b"plain", Hold("m"))
        store.compare_and_set("h", current.revision + 1, b"at:600000", Fenced("m", token))
        store.compare_and_set("h", current.revision + 2, b"plain",
                              Fenced("m", token, release=True))
        for revision in range(1, 4):
            store.compare_and_set("w", revision, b"at:-5", Release())  # ready now: a signal
    assert _fast_answers(client, namespace) == {"run_compare_and_set": 6, "run_get": 1}
    assert client.zcard(f"{{{namespace}}}:wake-ready") == 1  # its token, once
    assert store.get("h").holder == Free()


def _drain_lapsed(store: RedisRunStore, clock: Clock, under_session: bool,
                  ) -> list[list[tuple[str, int, str | None]]]:
    """A dead node's session of 30 runs lapses; a taker claims them 7 at a time (under a
    session of its own, or plain) until none is left: each claim's runs as (run, revision,
    session)."""
    clock.ms = START
    dead = store.open_session("dead", 1_000)
    for i in range(30):
        store.insert(f"r{i:02d}", b"plain", dead.lease)
    clock.advance(1_500)  # past the session's expiry: its runs are expired, all at once
    taker = store.open_session("taker", LONG) if under_session else None
    rounds = []
    while True:
        got = (taker.claim_expired(7, records=True) if taker is not None
               else store.claim_expired("taker", LONG, 7, records=True))
        rounds.append([(c.run, c.current.revision, c.current.session) for c in got])
        if not got:
            return rounds


@pytest.mark.parametrize("under_session", [False, True], ids=["plain", "session"])
def test_a_lapsed_sessions_swept_runs_are_taken_on_the_fast_path(
        under_session: bool, fake_clock: Clock) -> None:
    """The first claim after a session lapses sweeps its runs into the leases index (the
    general code's); the claims after it take them on the fast path, as expired leases,
    each run out of the dead session's set, the session gone with its last run, every key
    as the general code leaves it."""
    client = fakeredis.FakeRedis()
    runs: list[Any] = []
    spaces: list[str] = []
    counts: list[dict[str, int]] = []
    for fast in (True, False):
        namespace = unique_namespace()
        store = RedisRunStore(client, namespace=namespace, discover=discover,
                              timeout=SUITE_TIMEOUT)
        table = ({name: counted(getattr(scripts, name)) for name in FAST} if fast
                 else {name: variant(getattr(scripts, name), "") for name in FAST})
        with scripts_as(table):
            runs.append(_drain_lapsed(store, fake_clock, under_session))
        assert [s.owner for s in store.sessions()] == (["taker"] if under_session else [])
        spaces.append(namespace)
        counts.append(_fast_answers(client, namespace))
    assert runs[0] == runs[1]
    taken = [run for claim in runs[0] for run, _, _ in claim]
    assert sorted(taken) == [f"r{i:02d}" for i in range(30)]  # each once, in due order
    assert taken == sorted(taken)
    first, second = (contents(client, n) for n in spaces)
    first = {k: v for k, v in first.items() if not k.startswith(COUNTER + ":")}
    assert first == second
    # The sweeping claim and the last, empty one aside, every claim was the fast path's.
    assert counts[0].get("run_claim_expired", 0) >= len(runs[0]) - 2, counts[0]
