"""The dashboard on fakeredis: what its Source reads and how (bounded commands only), its
pages (escaped), its actions (CSRF, read-only, stale pages refused) and its live feed.

The browser drives it in tests/dashboard/test_dashboard_browser.py; MONITOR on a private server
checks the commands on the wire in the ``server`` test at the end of this file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import fakeredis
import httpx
import pytest
import redis

with warnings.catch_warnings():
    # Starlette 1.x would rather drive its TestClient with httpx2; httpx does the same.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from redisstore import Claim, Failure, Fenced, Hold, RedisRunStore, Release
from redisstore import Feed as StoreFeed
from redisstore.dashboard import Change, MinuteCounts, NoFeed, StoreSource, app
from redisstore.dashboard import source as source_module
from redisstore.dashboard.live import Feed
from redisstore.dashboard.source import Entry, Seen, decode_cursor, encode_cursor
from redisstore.discovery import json_wait
from redisstore.pytest_plugin import Clock
from redisstore.shells.store_ops import StoreOps

TOKEN = "operator-token-0123456789"
ORIGIN = {"origin": "http://testserver"}


class Recording(fakeredis.FakeRedis):
    """A fakeredis client that records every command sent through it (pipelines too)."""

    sent: list[tuple[Any, ...]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(args)
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        record = self.sent

        class Recorded(type(pipe)):  # type: ignore[misc]
            def execute(self, raise_on_error: bool = True) -> Any:
                record.extend(tuple(c[0]) for c in self.command_stack)
                return super().execute(raise_on_error)

        pipe.__class__ = Recorded
        return pipe


@pytest.fixture
def client(fake_clock: Clock) -> Recording:
    return Recording()


@pytest.fixture
def store(client: Recording) -> Iterator[RedisRunStore]:
    made = RedisRunStore(client, namespace="shop", discover=json_wait)
    yield made
    made.close()


def seed(store: RedisRunStore, clock: Clock) -> None:
    """One run in each state: held live, held expired, ready, waiting, quarantined."""
    store.insert("failed-1", b'{"wait": {"at": 0}}', Release())
    job = store.claim("node-c", ttl=60_000, records=True)[0]
    assert job.run == "failed-1" and job.current.token is not None
    store.finish("failed-1", 1, Fenced("node-c", job.current.token),
                 failure=Failure("KeyError: 'customer'", final=True))
    store.insert("held-2", b'{"n": 2}', Claim("node-b", 1_000))
    clock.advance(2_000)
    store.insert("held-1", b'{"n": 1}', Claim("node-a", 60_000))
    store.insert("ready-1", b'{"wait": {"at": 0}}', Release())
    store.insert("later-1", b'{"wait": {"at": %d}}' % (store.now() + 3_600_000), Release())


def web(asgi: Any) -> TestClient:
    return TestClient(asgi, base_url="http://testserver")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, html
    return found.group(1)


def logged_in(asgi: Any) -> tuple[TestClient, str]:
    browser = web(asgi)
    csrf = csrf_of(browser.get("/login").text)
    reply = browser.post("/login", data={"csrf": csrf, "token": TOKEN}, headers=ORIGIN,
                         follow_redirects=False)
    assert reply.status_code == 303, reply.text
    return browser, csrf


def form_of(html: str, action: str) -> dict[str, str]:
    """The hidden fields of the page's form for ``action``."""
    found = re.search(rf'<form method="post" action="/action/{action}".*?</form>', html,
                      re.S)
    assert found, f"no {action} form"
    return dict(re.findall(r'name="(\w+)" value="([^"]*)"', found.group(0)))


def unescape(value: str) -> str:
    import html

    return html.unescape(value)


# ------------------------------------------------------------------------ the Source


def test_counts_by_state(store: RedisRunStore, client: Recording, fake_clock: Clock) -> None:
    seed(store, fake_clock)
    counts = StoreSource(client, ["shop"]).counts("shop")
    assert counts.by_state() == {"held_live": 1, "held_expired": 1, "ready_now": 1,
                                 "waiting_time": 1, "quarantined": 1}
    fake_clock.advance(3_600_000)
    assert StoreSource(client, ["shop"]).counts("shop").by_state() == {
        "held_live": 0, "held_expired": 2, "ready_now": 2, "waiting_time": 0,
        "quarantined": 1}


def test_a_listing_pages_by_cursor_through_runs_of_one_score(
        store: RedisRunStore, client: Recording) -> None:
    """120 runs ready at the same time (one score): pages of 50 by a (score, id) cursor
    cover each once, also when the cursor's own run is gone before the next page."""
    runs = [f"run-{i:03d}" for i in range(120)]
    for run in runs:
        store.insert(run, b'{"wait": {"at": 0}}', Release())
    source = StoreSource(client, ["shop"])
    first = source.listing("shop", "ready_now")
    assert [e.run for e in first.entries] == runs[:50] and first.next
    store.delete(first.entries[-1].run, 1, Release())  # the cursor's run goes
    second = source.listing("shop", "ready_now", first.next)
    assert [e.run for e in second.entries] == runs[50:100]
    third = source.listing("shop", "ready_now", second.next)
    assert [e.run for e in third.entries] == runs[100:] and third.next is None
    # A run inserted before the cursor does not shift the next page (no offset).
    store.insert("run-000a", b'{"wait": {"at": 0}}', Release())
    again = source.listing("shop", "ready_now", first.next)
    assert [e.run for e in again.entries] == runs[50:100]


def test_the_cursor_keeps_any_run_id() -> None:
    for run in ["a", "a:b:c", "<script>", "ü/ß?x=1&y", ""]:
        assert decode_cursor(encode_cursor(Entry(run, 17))) == (17, run)
    with pytest.raises(ValueError):
        decode_cursor("x:1")


def test_listings_merge_partitions(client: Recording) -> None:
    store = RedisRunStore(client, namespace="spread", discover=json_wait, partitions=3)
    runs = [f"p-{i:02d}" for i in range(30)]
    for run in runs:
        store.insert(run, b'{"wait": {"at": 0}}', Release())
    source = StoreSource(client, ["spread"])
    assert source.counts("spread").ready_now == 30
    assert source.counts("spread").partitions == 3
    seen: list[str] = []
    after = None
    while True:
        page = source.listing("spread", "ready_now", after, limit=7)
        seen += [e.run for e in page.entries]
        if page.next is None:
            break
        after = page.next
    assert seen == runs
    store.close()


def test_owners_are_exact_over_the_whole_index_else_at_least(
        store: RedisRunStore, client: Recording, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(6):
        store.insert(f"a-{i}", b"{}", Claim("node-a", 60_000 + i))
    store.insert("b-0", b"{}", Claim("node-b", 30_000))
    owners = StoreSource(client, ["shop"]).owners("shop")
    assert owners.complete and owners.total == 7
    assert [(o.owner, o.runs, o.live) for o in owners.rows] == [("node-a", 6, 6),
                                                                ("node-b", 1, 1)]
    monkeypatch.setattr(source_module, "OWNERS_SLICE", 3)
    part = StoreSource(client, ["shop"]).owners("shop")
    assert not part.complete and part.read == 3 and part.total == 7 and part.next
    assert {o.owner: o.runs for o in part.rows} == {"node-b": 1, "node-a": 2}
    rest = StoreSource(client, ["shop"]).owners("shop", part.next)
    assert sum(o.runs for o in rest.rows) == 3


def test_counts_and_owners_include_the_runs_of_live_sessions(
        store: RedisRunStore, client: Recording, fake_clock: Clock) -> None:
    """A session's runs have no lease entry of their own: the counts and the owners view
    take them from the session (the Worker holds its runs so by default)."""
    for run in ("s-1", "s-2", "s-3"):
        store.insert(run, b'{"wait": {"at": 0}}', Release())
    session = store.open_session("node-s", 60_000)
    assert len(session.claim(3)) == 3
    store.insert("own", b"{}", Claim("node-a", 60_000))
    source = StoreSource(client, ["shop"])
    assert source.counts("shop").held_live == 4
    owners = source.owners("shop")
    assert [(o.owner, o.runs, o.live) for o in owners.rows] == [("node-s", 3, 3),
                                                                ("node-a", 1, 1)]
    assert owners.total == 4
    # Lapsed (and "own" expired): a claim puts its runs into the leases index, takes one.
    fake_clock.advance(60_000)
    assert len(store.claim_expired("node-b", 60_000, 1)) == 1
    counts = StoreSource(client, ["shop"]).counts("shop")
    assert (counts.held_live, counts.held_expired) == (1, 3)


def test_a_session_lapsed_in_one_partition_holds_no_run_of_it_live(
        client: Recording, fake_clock: Clock) -> None:
    """Over partitions, a session that lapsed in one partition only (its node away past the
    ttl) holds its runs there expired: the counts and the owners view count live only the
    runs of the partitions where it lives."""
    from redisstore.core.partitions import partition_of

    store = RedisRunStore(client, namespace="parts", discover=json_wait, partitions=4)
    runs = [f"p-{i}" for i in range(12)]
    for run in runs:
        store.insert(run, b'{"wait": {"at": 0}}', Release())
    session = store.open_session("node-s", 60_000)
    assert len(session.claim(len(runs))) == len(runs)
    # Partition 1's record of the session lapsed (its keepalives cut off), as the server
    # would have it.
    gone = store._ops.parts[1].keys
    past = int(client.time()[0]) * 1000 - 1
    client.hset(gone.sessions, session.id, f"{past},60000,,node-s")
    client.zadd(gone.session_leases, {session.id: past})
    live = len([run for run in runs if partition_of(run, 4) != 1])
    assert 0 < live < len(runs)
    source = StoreSource(client, ["parts"])
    assert source.counts("parts").held_live == live
    owners = source.owners("parts")
    assert [(o.owner, o.runs, o.live) for o in owners.rows] == [("node-s", live, live)]
    store.close()


def test_the_quarantine_is_listed_with_its_errors(store: RedisRunStore, client: Recording,
                                                  fake_clock: Clock) -> None:
    seed(store, fake_clock)
    page = StoreSource(client, ["shop"]).quarantine("shop")
    assert page.rows == [("failed", "failed-1", "final", "KeyError: 'customer'")]
    assert page.next is None


def test_a_scan_is_explicit_bounded_and_cached(store: RedisRunStore, client: Recording,
                                               fake_clock: Clock) -> None:
    seed(store, fake_clock)
    store.insert("waiter", b'{"wait": {"changed": "payment-1"}}', Release())
    client.set("{other-app}:thing", b"x")  # a hash tag but no run key: not a namespace
    client.set("plain-key", b"x")
    source = StoreSource(client, [])
    assert source.namespaces() == [] and source.last_scan() is None
    client.sent.clear()
    found = source.scan()
    assert found.complete and list(found.namespaces) == ["shop"]
    assert found.namespaces["shop"]["runs"] == 6
    assert found.namespaces["shop"]["dependency_waiters"] == 1
    assert source.namespaces() == ["shop"]
    assert {c[0] for c in client.sent} == {"SCAN", "SCARD"}
    client.sent.clear()
    assert source.scan() is found and client.sent == []  # cached for SCAN_PAUSE


# ------------------------------------------------------------------------ pages


#: Every command a page may send itself: bounded reads. (The store's scripts go through
#: the store's own connections: test_the_store_calls_of_pages_are_reads checks them.)
ALLOWED = {"ZCOUNT", "ZRANGE", "ZSCORE", "ZRANK", "ZCARD", "HLEN", "HSCAN", "HGET",
           "TIME"}


def _pages(store: RedisRunStore) -> list[str]:
    return ["/", "/ns?ns=shop", "/owners?ns=shop", *[f"/runs?ns=shop&state={s}" for s in
                                                    source_module.STATES],
            "/run?ns=shop&id=held-1", "/run?ns=shop&id=failed-1", "/run?ns=shop&id=nope",
            "/metrics"]


def test_pages_send_only_bounded_reads(store: RedisRunStore, client: Recording,
                                       fake_clock: Clock) -> None:
    seed(store, fake_clock)
    for i in range(60):
        store.insert(f"bulk-{i:02d}", b'{"wait": {"at": 0}}', Release())
    browser = web(app(client, namespaces=["shop"]))
    nxt = ""
    for path in [*_pages(store), "next"]:
        if path == "next":
            path = nxt
        client.sent.clear()
        reply = browser.get(path)
        assert reply.status_code in (200, 404), (path, reply.text)
        names = {str(c[0]).upper().split()[0] for c in client.sent}
        assert names <= ALLOWED, (path, names - ALLOWED)
        for command in client.sent:
            if str(command[0]).upper() == "ZRANGE":
                args = [str(a).upper() for a in command[2:]]
                if "BYSCORE" in args:  # a first page: LIMIT 0 n
                    limit = args.index("LIMIT")
                    assert args[limit + 1] == "0" and int(args[limit + 2]) <= 201, command
                else:  # a page from a cursor's rank: at most a page's worth
                    assert int(command[3]) - int(command[2]) <= 200, command
        found = re.search(r'id="next" href="([^"]+)"', reply.text)
        if path.endswith("state=ready_now") and found:
            nxt = unescape(found.group(1))
    assert nxt, "the ready listing had a next page"


def test_the_store_calls_of_pages_are_reads(store: RedisRunStore, client: Recording,
                                            fake_clock: Clock,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seed(store, fake_clock)
    called: list[str] = []
    for name in ("now", "get", "get_many", "insert", "compare_and_set", "delete", "finish",
                 "restore", "release", "renew", "claim", "claim_ready", "claim_expired",
                 "refresh", "quarantined", "migrate"):
        real = getattr(StoreOps, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name,
                **kwargs: Any) -> Any:
            called.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(StoreOps, name, spy)
    browser = web(app(client, namespaces=["shop"]))
    for path in _pages(store):
        browser.get(path)
    assert set(called) == {"get", "get_many"}


def test_a_page_never_scans(store: RedisRunStore, client: Recording, fake_clock: Clock
                            ) -> None:
    seed(store, fake_clock)
    browser = web(app(client, namespaces=["shop"]))
    client.sent.clear()
    for path in _pages(store):
        browser.get(path)
    assert not [c for c in client.sent if str(c[0]).upper() in ("SCAN", "KEYS")]
    csrf = csrf_of(browser.get("/").text)
    client.sent.clear()
    reply = browser.post("/scan", data={"csrf": csrf}, headers=ORIGIN)
    assert reply.status_code == 200 and "Last scan: 1 namespace(s)" in reply.text
    assert [c[0] for c in client.sent].count("SCAN") == 1


def test_stored_text_is_escaped_everywhere(client: Recording) -> None:
    """Run ids, owners, records, errors and namespace names holding markup are shown as
    text on every page: no tag of theirs reaches the HTML."""
    evil = '<script>alert("x")</script>'
    ns = "ns<b>"
    store = RedisRunStore(client, namespace=ns, discover=json_wait)
    store.insert(f"run-{evil}", b'{"wait": {"at": 0}, "note": "</pre><script>1</script>"}',
                 Release())
    store.insert(f"held-{evil}", b"</pre><img src=x onerror=alert(1)>\xff",
                 Claim(f"owner-{evil}", 60_000))
    store.insert("failing", b'{"wait": {"at": 0}}', Release())
    job = next(j for j in store.claim("w", 60_000, limit=5, records=True) if j.run == "failing")
    assert job.current.token is not None
    store.finish("failing", 1, Fenced("w", job.current.token),
                 failure=Failure(f"boom {evil}", final=True))
    browser = web(app(client, namespaces=[ns], allow_actions=True, token=TOKEN))
    pages = ["/", f"/ns?ns={ns}", f"/owners?ns={ns}", f"/runs?ns={ns}&state=ready_now",
             f"/runs?ns={ns}&state=held_live", f"/runs?ns={ns}&state=quarantined"]
    pages += [str(httpx.URL("/run", params={"ns": ns, "id": run}))
              for run in (f"held-{evil}", "failing", f"no-{evil}")]
    for path in pages:
        text = browser.get(path).text
        assert "<script>alert" not in text and "<b>" not in text.replace(
            "<b>ids", "") and "<img" not in text, path
    run_page = browser.get("/run", params={"ns": ns, "id": f"held-{evil}"}).text
    assert "held-&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in run_page
    assert "&lt;/pre&gt;&lt;img src=x onerror=alert(1)&gt;\ufffd" in run_page
    assert "owner-&lt;script&gt;" in run_page
    assert "boom &lt;script&gt;" in browser.get(f"/runs?ns={ns}&state=quarantined").text
    metrics = browser.get("/metrics").text
    assert 'namespace="ns<b>"' in metrics  # text/plain: a label, not markup
    assert browser.get("/").headers["content-security-policy"].startswith("default-src")
    store.close()


def test_a_big_record_is_cut_and_json_is_pretty(store: RedisRunStore, client: Recording
                                                ) -> None:
    store.insert("big", b"x" * (200 << 10), Release())
    store.insert("doc", json.dumps({"a": [1, 2], "b": "c"}).encode(), Release())
    browser = web(app(client, namespaces=["shop"]))
    big = browser.get("/run?ns=shop&id=big").text
    assert "204800 bytes" in big and "x" * (64 << 10) in big and "x" * ((64 << 10) + 1) \
        not in big
    assert '{\n  &#34;a&#34;: [\n    1,' in browser.get("/run?ns=shop&id=doc").text


def test_the_chart_draws_what_rates_gives_else_says_no_data(
        store: RedisRunStore, client: Recording) -> None:
    class Counted(StoreSource):
        def rates(self, namespace: str) -> list[MinuteCounts]:
            start = 1_800_000_000_000
            return [MinuteCounts(start + i * 60_000, 10 + i, 8 + i, i % 3) for i in range(60)]

        def events(self, namespace: str, run: str, limit: int = 20) -> list[Change]:
            return [Change(namespace, run, 3, "claimed", "<i>node</i>", 1_800_000_000_000,
                           "c-1", takeover=True)]

    store.insert("r", b"{}", Release())
    plain = web(app(client, namespaces=["shop"])).get("/ns?ns=shop").text
    # A namespace without a feed counts nothing: the page says how to switch it on.
    assert "Not counted" in plain and "feed=Feed()" in plain and "<svg" not in plain
    assert "No events" in web(app(client, namespaces=["shop"])).get("/run?ns=shop&id=r").text
    board = web(app(Counted(client, ["shop"])))
    text = board.get("/ns?ns=shop").text
    assert text.count("<polyline") == 3 and "No data yet" not in text
    assert "69</span>" not in text and "claims</span> 69" in text
    run = board.get("/run?ns=shop&id=r").text
    assert "claimed (takeover)" in run and "&lt;i&gt;node&lt;/i&gt;" in run


def test_the_chart_and_metrics_read_the_stores_counters(client: Recording,
                                                        fake_clock: Clock) -> None:
    """A namespace with a feed: the scripts count, the chart and /metrics read them (one
    script a partition: tests/lua/test_stall.py bounds it at its cap)."""
    fed = RedisRunStore(client, namespace="fed", discover=json_wait, feed=StoreFeed())
    for n in range(3):
        fed.insert(f"r{n}", b'{"wait": {"at": 0}}', Release())
    fed.insert("lost", b'{"wait": {"at": 0}}', Claim("node-b", 1_000))
    fake_clock.advance(60_000)  # a minute on: the takeover and the rest in this one
    claimed = fed.claim("node-a", 60_000, 10, records=True)
    assert len(claimed) == 4
    for job in claimed[:2]:
        assert job.current.token is not None
        fed.finish(job.run, job.current.revision, Fenced("node-a", job.current.token))
    fake_clock.advance(60_000)  # that minute is now the last complete one
    board = web(app(client, namespaces=["fed"]))
    text = board.get("/ns?ns=fed").text
    assert text.count("<polyline") == 3 and "Not counted" not in text
    assert "claims</span> 0" in text  # this minute: nothing yet
    metrics = board.get("/metrics").text
    for kind, minute in (("claims", 4), ("finishes", 2), ("takeovers", 1)):
        assert f'redisstore_work_last_minute{{namespace="fed",kind="{kind}"}} {minute}' \
            in metrics
        assert f'redisstore_work_last_hour{{namespace="fed",kind="{kind}"}} {minute}' \
            in metrics
    assert "# TYPE redisstore_work_last_minute gauge" in metrics
    fake_clock.advance(60 * 60_000)  # an hour on: gone from the chart and the metrics
    assert 'kind="claims"} 0' in board.get("/metrics").text
    fed.close()


def test_metrics_give_counts_by_state_per_namespace(store: RedisRunStore, client: Recording,
                                                    fake_clock: Clock) -> None:
    seed(store, fake_clock)
    text = web(app(client, namespaces=["shop", 'q"\\'])).get("/metrics").text
    assert 'redisstore_runs{namespace="shop",state="held_live"} 1' in text
    assert 'redisstore_runs{namespace="shop",state="quarantined"} 1' in text
    assert 'redisstore_namespace_up{namespace="q\\"\\\\"} 1' in text
    assert "# TYPE redisstore_runs gauge" in text


# ------------------------------------------------------------------------ actions


def test_read_only_answers_403_to_every_action(store: RedisRunStore, client: Recording,
                                                fake_clock: Clock) -> None:
    seed(store, fake_clock)
    browser = web(app(client, namespaces=["shop"]))
    page = browser.get("/run?ns=shop&id=held-1").text
    assert 'action="/action/' not in page and "read-only" in page
    csrf = csrf_of(browser.get("/").text)
    fields = {"csrf": csrf, "ns": "shop", "id": "held-1", "revision": "1", "owner": "node-a",
              "token": "1"}
    for action in ("release", "restore", "delete", "anything"):
        assert browser.post(f"/action/{action}", data=fields,
                            headers=ORIGIN).status_code == 403
    assert browser.get("/login").status_code == 403
    assert browser.post("/login", data={"csrf": csrf, "token": TOKEN},
                        headers=ORIGIN).status_code == 403
    assert store.get("held-1").revision == 1 and store.get("held-1").token is not None


def test_actions_need_a_token(client: Recording) -> None:
    with pytest.raises(ValueError):
        app(client, allow_actions=True)


def test_cross_site_posts_are_refused(store: RedisRunStore, client: Recording,
                                      fake_clock: Clock) -> None:
    seed(store, fake_clock)
    browser, csrf = logged_in(app(client, namespaces=["shop"], allow_actions=True,
                                  token=TOKEN))
    fields = form_of(browser.get("/run?ns=shop&id=held-1").text, "delete")
    refusals = [
        ({}, fields),  # no Origin, no Referer
        ({"origin": "http://evil.example"}, fields),
        ({"origin": "null"}, fields),
        ({"referer": "http://evil.example/page"}, fields),
        (ORIGIN, {**fields, "csrf": ""}),
        (ORIGIN, {**fields, "csrf": "0" * 64}),
        (ORIGIN, {k: v for k, v in fields.items() if k != "csrf"}),
    ]
    for headers, data in refusals:
        reply = browser.post("/action/delete", data=data, headers=headers,
                             follow_redirects=False)
        assert reply.status_code == 403, (headers, data)
    # Another session's token does not pass for this one.
    other = web(app(client, namespaces=["shop"], allow_actions=True, token=TOKEN))
    assert other.post("/action/delete", data=fields, headers=ORIGIN).status_code == 403
    assert store.get("held-1").revision == 1
    # A JSON body is no form: refused too.
    reply = browser.post("/action/delete", json=fields, headers=ORIGIN)
    assert reply.status_code == 403
    # A same-site Referer without an Origin passes.
    reply = browser.post("/action/delete", data=fields,
                         headers={"referer": "http://testserver/run"}, follow_redirects=False)
    assert reply.status_code == 303
    assert csrf == fields["csrf"]


def test_an_operator_logs_in_with_the_token_only(client: Recording) -> None:
    asgi = app(client, namespaces=["shop"], allow_actions=True, token=TOKEN)
    browser = web(asgi)
    csrf = csrf_of(browser.get("/login").text)
    assert browser.post("/login", data={"csrf": csrf, "token": TOKEN + "x"},
                        headers=ORIGIN).status_code == 403
    fields = {"csrf": csrf, "ns": "shop", "id": "x", "revision": "1", "owner": "", "token": ""}
    reply = browser.post("/action/delete", data=fields, headers=ORIGIN)
    assert reply.status_code == 403 and "log in" in reply.text
    assert browser.post("/login", data={"csrf": csrf, "token": TOKEN}, headers=ORIGIN,
                        follow_redirects=False).status_code == 303
    assert browser.post("/action/delete", data=fields, headers=ORIGIN).status_code == 409
    browser.post("/logout", data={"csrf": csrf}, headers=ORIGIN)
    assert browser.post("/action/delete", data=fields, headers=ORIGIN).status_code == 403


def test_release_restore_and_delete_act_on_what_the_page_showed(
        store: RedisRunStore, client: Recording, fake_clock: Clock) -> None:
    seed(store, fake_clock)
    browser, _ = logged_in(app(client, namespaces=["shop"], allow_actions=True, token=TOKEN))
    page = browser.get("/run?ns=shop&id=held-1").text
    assert 'action="/action/restore"' not in page
    reply = browser.post("/action/release", data=form_of(page, "release"), headers=ORIGIN,
                         follow_redirects=False)
    assert reply.status_code == 303 and "done=released" in reply.headers["location"]
    assert store.get("held-1").token is None and store.get("held-1").revision == 1

    page = browser.get("/run?ns=shop&id=failed-1").text
    assert 'action="/action/release"' not in page  # free: nothing to release
    reply = browser.post("/action/restore", data=form_of(page, "restore"), headers=ORIGIN)
    assert reply.status_code == 200 and "Restored." in reply.text
    assert store.get("failed-1").quarantined is None

    page = browser.get("/run?ns=shop&id=held-2").text
    reply = browser.post("/action/delete", data=form_of(page, "delete"), headers=ORIGIN)
    assert reply.status_code == 200 and "Deleted run held-2." in reply.text
    assert "held-2" not in store.get_many(["held-2"])


def test_a_stale_pages_action_is_refused_with_the_run_as_it_is(
        store: RedisRunStore, client: Recording, fake_clock: Clock) -> None:
    seed(store, fake_clock)
    browser, _ = logged_in(app(client, namespaces=["shop"], allow_actions=True, token=TOKEN))
    held = browser.get("/run?ns=shop&id=held-1").text
    # Written since the page: its revision moved.
    store.compare_and_set("held-1", 1, b'{"n": 1.5}', Hold("node-a"))
    for action in ("release", "delete"):
        reply = browser.post(f"/action/{action}", data=form_of(held, action), headers=ORIGIN)
        assert reply.status_code == 409, action
        assert "revision 2, the page showed 1" in reply.text
        assert 'id="now-revision">2<' in reply.text and 'id="now-holder">node-a<' in reply.text
    assert store.get("held-1").revision == 2 and store.get("held-1").token is not None
    # Claimed again since the page (no write: same revision, another grant).
    expired = browser.get("/run?ns=shop&id=held-2").text
    assert store.claim_expired("node-z", 60_000, 10) == ["held-2"]
    for action in ("release", "delete"):
        reply = browser.post(f"/action/{action}", data=form_of(expired, action),
                             headers=ORIGIN)
        assert reply.status_code == 409 and "changed hands" in reply.text
        assert 'id="now-holder">node-z<' in reply.text
    # Free on the page, held live by another owner now.
    ready = browser.get("/run?ns=shop&id=ready-1").text
    assert store.claim_ready("node-y", 60_000, 10) == ["ready-1"]
    reply = browser.post("/action/delete", data=form_of(ready, "delete"), headers=ORIGIN)
    assert reply.status_code == 409 and 'id="now-holder">node-y<' in reply.text
    # Quarantined on the page; put back and written since.
    failed = browser.get("/run?ns=shop&id=failed-1").text
    assert store.restore("failed-1")
    reply = browser.post("/action/restore", data=form_of(failed, "restore"), headers=ORIGIN)
    assert reply.status_code == 409 and "not quarantined" in reply.text
    store.compare_and_set("failed-1", 1, b'{"wait": null}', Release())
    reply = browser.post("/action/restore", data=form_of(failed, "restore"), headers=ORIGIN)
    assert reply.status_code == 409 and "revision 2, the page showed 1" in reply.text
    assert 'id="now-revision">2<' in reply.text
    # Gone since the page.
    store.delete("later-1", 1, Release())
    reply = browser.post("/action/delete", data={**form_of(ready, "delete"), "id": "later-1"},
                         headers=ORIGIN)
    assert reply.status_code == 409 and "no longer exists" in reply.text


def test_the_restore_is_one_checked_script(store: RedisRunStore, client: Recording,
                                           fake_clock: Clock,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore action sends ``restore(run, expected=<the page's revision>)`` and no read
    before it: no write can come between a check and the restore."""
    seed(store, fake_clock)
    browser, _ = logged_in(app(client, namespaces=["shop"], allow_actions=True, token=TOKEN))
    failed = browser.get("/run?ns=shop&id=failed-1").text
    calls: list[tuple[str, tuple[Any, ...]]] = []
    real_restore = StoreOps.restore

    def no_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a read before the restore")

    def restore(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(("restore", args))
        return real_restore(self, *args, **kwargs)

    monkeypatch.setattr(StoreOps, "get", no_read)
    monkeypatch.setattr(StoreOps, "restore", restore)
    reply = browser.post("/action/restore", data=form_of(failed, "restore"), headers=ORIGIN,
                         follow_redirects=False)
    assert reply.status_code == 303, reply.text
    assert calls == [("restore", ("failed-1", 1))]
    monkeypatch.undo()
    assert store.get("failed-1").quarantined is None


def test_a_malformed_action_form_is_a_400(client: Recording) -> None:
    browser, csrf = logged_in(app(client, namespaces=["shop"], allow_actions=True,
                                  token=TOKEN))
    base = {"csrf": csrf, "ns": "shop", "id": "x", "revision": "1", "owner": "", "token": ""}
    for bad in ({"revision": "one"}, {"owner": "a"}, {"token": "5"}, {"ns": "a{b}"},
                {"id": ""}):
        reply = browser.post("/action/release", data={**base, **bad}, headers=ORIGIN)
        assert reply.status_code == 400, bad


def test_seen_matches_revision_and_grant() -> None:
    from redisstore import Current, Free, Held

    held = Current(3, b"", Held("a", True), token=7)
    assert Seen(3, "a", 7).matches(held)
    assert not Seen(3, "a", 6).matches(held) and not Seen(2, "a", 7).matches(held)
    assert Seen(3).matches(Current(3, b"", Free())) and not Seen(3).matches(held)


# ------------------------------------------------------------------------ the live feed


def _collect(stream: Any, count: int, timeout: float = 5.0) -> Any:
    async def take() -> list[str]:
        got = []
        while len(got) < count:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout)
            if not chunk.startswith((":", "retry:")):
                got.append(chunk)
        return got

    return take()


async def _until(page: Any, ready: int) -> tuple[str, str, dict[str, Any]]:
    """The first counts event of ``page`` with ``ready`` runs ready now (the reader's
    first round may repeat the snapshot a page opened with)."""
    while True:
        event = _parse((await _collect(page, 1))[0])
        if event[2]["counts"]["ready_now"] == ready:
            return event


def _parse(chunk: str) -> tuple[str, str, dict[str, Any]]:
    fields = dict(line.split(": ", 1) for line in chunk.strip().splitlines())
    return fields["id"], fields["event"], json.loads(fields["data"])


def test_the_feed_polls_counts_once_for_every_page_and_resumes(
        store: RedisRunStore, client: Recording) -> None:
    class Counting(StoreSource):
        reads = 0

        def counts(self, namespace: str) -> Any:
            Counting.reads += 1
            return super().counts(namespace)

    source = Counting(client, ["shop"])
    feed = Feed(source, interval=0.05)

    async def scenario() -> None:
        pages = [feed.stream("shop", None) for _ in range(5)]
        for page in pages:  # each opens with a snapshot
            (first,) = await _collect(page, 1)
            assert _parse(first)[1] == "counts"
        await asyncio.sleep(0.3)  # rounds with nothing new: no event
        rounds, reads = feed.rounds, Counting.reads
        store.insert("new", b'{"wait": {"at": 0}}', Release())
        got = [await _until(page, 1) for page in pages]
        assert {g[2]["counts"]["ready_now"] for g in got} == {1}
        assert len({g[0] for g in got}) == 1  # one event, fanned out
        # One read per round whatever the number of pages.
        assert Counting.reads - reads <= feed.rounds - rounds + 1
        last_id = got[0][0]
        store.insert("newer", b'{"wait": {"at": 0}}', Release())
        (nxt,) = await _collect(pages[0], 1)
        assert _parse(nxt)[2]["counts"]["ready_now"] == 2
        # A page back with Last-Event-ID gets what it missed, then goes on.
        back = feed.stream("shop", last_id)
        (missed,) = await _collect(back, 1)
        assert _parse(missed)[0] == _parse(nxt)[0]
        # An id of another process: a snapshot instead.
        other = feed.stream("shop", "feedbeef-3")
        (snap,) = await _collect(other, 1)
        assert _parse(snap)[2]["counts"]["ready_now"] == 2
        for page in [*pages, back, other]:
            await page.aclose()
        await feed.close()

    asyncio.run(scenario())


def test_the_feed_reads_the_stores_change_feed_when_there_is_one(client: Recording) -> None:
    class Fed(StoreSource):
        asked: ClassVar[list[str | None]] = []

        def changes(self, namespace: str, after: str | None, limit: int = 100,
                    block: int | None = None) -> list[Change]:
            Fed.asked.append(after)
            n = len(Fed.asked)
            return [Change(namespace, "r-1", n, "written", "node-a", 1_800_000_000_000 + n,
                           f"c{n}")]

    feed = Feed(Fed(client, ["shop"]), interval=0.05)

    async def scenario() -> None:
        page = feed.stream("shop", None)
        chunks = [_parse(c) for c in await _collect(page, 4)]
        kinds = [kind for _, kind, _ in chunks]
        assert kinds[0] == "counts" and "change" in kinds
        change = next(data for _, kind, data in chunks if kind == "change")
        assert change["run"] == "r-1" and change["kind"] == "written"
        assert Fed.asked[0] is None and Fed.asked[1] == "c1"  # resumed from its cursor
        await page.aclose()
        await feed.close()

    asyncio.run(scenario())


def _changes_of(chunks: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, int]]:
    return [(data["run"], data["revision"]) for _, kind, data in chunks if kind == "change"]


async def _until_change(page: Any, run: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The page's events up to the change of ``run``."""
    got = []
    while True:
        event = _parse((await _collect(page, 1))[0])
        got.append(event)
        if event[1] == "change" and event[2]["run"] == run:
            return got


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_page_that_drops_and_reconnects_loses_no_change(partitions: int) -> None:
    """The ids of a namespace's page carry its feed cursor: back with its Last-Event-ID, to
    this process or to another (a restart: none of its events kept), it is sent every
    change it missed, once, then the live ones."""
    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace="fed", partitions=partitions, feed=StoreFeed())
    store.insert("before", b"x", Release())
    feed = Feed(StoreSource(client, ["fed"]), interval=0.05)

    async def scenario() -> None:
        page = feed.stream("fed", None)
        (first,) = await _collect(page, 1)
        assert "~f1:" in _parse(first)[0]  # a fresh page's position: the feed's end
        store.insert("a", b"x", Release())
        got = await _until_change(page, "a")
        assert _changes_of(got) == [("a", 1)]  # not "before": the page opened after it
        dropped_at = got[-1][0]
        await page.aclose()  # the drop
        for run in ("b", "c", "d"):
            store.insert(run, b"x", Release())
        store.compare_and_set("a", 1, b"y", Release())
        missed = [("b", 1), ("c", 1), ("d", 1), ("a", 2)]
        # Back to this process, and to another one (another epoch, a reader from now).
        other = Feed(StoreSource(client, ["fed"]), interval=0.05)
        for n, process in enumerate((feed, other)):
            back = process.stream("fed", dropped_at)
            store.insert(f"live-{n}", b"x", Release())
            got_back = _changes_of(await _until_change(back, f"live-{n}"))
            # Every change since the drop, once each (a run's in its order); none before
            # the drop.
            missed.append((f"live-{n}", 1))
            assert sorted(got_back) == sorted(missed)
            assert [r for r in got_back if r[0] == "a"] == [("a", 2)]
            store.insert(f"after-{n}", b"x", Release())
            assert _changes_of(await _until_change(back, f"after-{n}")) == [(f"after-{n}", 1)]
            missed.append((f"after-{n}", 1))
            await back.aclose()
        await feed.close()
        await other.close()

    asyncio.run(scenario())


def test_a_page_behind_what_the_feed_keeps_is_told() -> None:
    """A cursor past which the feed lost entries: a ``compacted`` event (never a silent
    gap), then the page goes on from what the feed still holds."""
    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace="fed", feed=StoreFeed())
    store.insert("kept", b"x", Release())
    feed = Feed(StoreSource(client, ["fed"]), interval=0.05)

    async def scenario() -> None:
        lost = "0-1~f1:99999999999999-0@999999"  # entries up to it lost (a failover)
        page = feed.stream("fed", lost)
        chunks = [_parse(c) for c in await _collect(page, 3)]
        assert chunks[0][1] == "compacted"
        assert "the feed ends before the cursor" in chunks[0][2]["reason"]
        assert _changes_of(chunks[1:]) == [("kept", 1)]
        await page.aclose()
        await feed.close()

    asyncio.run(scenario())


def test_the_reader_tells_the_pages_when_its_own_cursor_was_trimmed() -> None:
    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace="fed", feed=StoreFeed())
    store.insert("a", b"x", Release())
    feed = Feed(StoreSource(client, ["fed"]), interval=0.05)
    feed._cursors["fed"] = "f1:99999999999999-0@999999"

    async def scenario() -> None:
        page = feed.stream("fed", "0-0")  # no cursor: from the reader's events
        told = None
        while told is None:
            event = _parse((await _collect(page, 1))[0])
            if event[1] == "compacted":
                told = event
        assert "the feed ends before the cursor" in told[2]["reason"]
        await page.aclose()
        await feed.close()

    asyncio.run(scenario())


def test_a_source_without_a_feed_says_so(client: Recording) -> None:
    with pytest.raises(NoFeed):
        StoreSource(client, ["shop"]).changes("shop", None)


# ------------------------------------------------------------------------ the command


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDISSTORE_URL"}
    return subprocess.run([sys.executable, "-m", "redisstore", "dashboard", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_the_command_checks_its_arguments(tmp_path: Any) -> None:
    assert "needs a server" in _command().stderr
    assert "--allow-actions needs --token-file" in _command("--demo", "--allow-actions").stderr
    short = tmp_path / "short"
    short.write_text("abc\n")
    assert "16 characters" in _command("--demo", "--allow-actions", "--token-file",
                                       str(short)).stderr
    assert "cannot read" in _command("--demo", "--allow-actions", "--token-file",
                                     str(tmp_path / "absent")).stderr
    assert "namespace must not" in _command("--demo", "--namespace", "a{b}").stderr
    assert "--token-file is for" in _command("--demo", "--token-file", str(short)).stderr


def _serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "REDISSTORE_URL"}
    process = subprocess.Popen([sys.executable, "-m", "redisstore", "dashboard",
                                "--port", "0", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"on (http://\S+/) ", line)
    assert found, line + (process.stderr.read() if process.poll() is not None else "")
    return process, found.group(1)


def test_the_demo_serves_every_view_and_ctrl_c_ends_it_with_130() -> None:
    process, url = _serve("--demo")
    try:
        deadline = time.monotonic() + 20
        while True:  # the demo's workers get going
            counts = httpx.get(url + "metrics").text
            if 'demo-orders",state="held_live"} 0' not in counts or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert 'redisstore_runs{namespace="demo-orders"' in counts
        for path in ["", "ns?ns=demo-orders", "owners?ns=demo-orders",
                     "runs?ns=demo-billing&state=quarantined",
                     "run?ns=demo-billing&id=invoice-held"]:
            reply = httpx.get(url + path)
            assert reply.status_code == 200, path
        assert "read-only" in httpx.get(url).text
        with httpx.stream("GET", url + "events?ns=demo-orders", timeout=5) as events:
            lines = events.iter_lines()
            assert next(lines) == "retry: 1000"  # the browser's wait before it reconnects
            assert next(lines) == ""
            assert next(lines).startswith("id: ")
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 130, (out, err)
    assert "redisstore dashboard: interrupted" in out and "Traceback" not in err


def test_a_urls_password_is_never_shown() -> None:
    process, url = _serve("--url", "redis://app:s3cret-pw@127.0.0.1:1/0", "--namespace",
                          "shop")
    try:
        pages = [httpx.get(url + path).text for path in ("", "ns?ns=shop", "metrics")]
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    assert "redis://***@127.0.0.1:1/0" in pages[0]
    assert "ConnectionError" in pages[1]
    for text in [*pages, out, err]:
        assert "s3cret" not in text


def test_only_the_names_given_reach_it(client: Recording) -> None:
    asgi = app(client, hosts=["127.0.0.1", "localhost"])
    assert TestClient(asgi, base_url="http://127.0.0.1:8080").get("/").status_code == 200
    assert TestClient(asgi, base_url="http://localhost").get("/").status_code == 200
    rebound = TestClient(asgi, base_url="http://attacker.example:8080").get("/")
    assert rebound.status_code == 400 and rebound.text == "unknown host"


def test_the_app_mounts_under_a_prefix(store: RedisRunStore, client: Recording,
                                       fake_clock: Clock) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    seed(store, fake_clock)
    outer = Starlette(routes=[Mount("/ops/runs", app(client, namespaces=["shop"]))])
    page = web(outer).get("/ops/runs/ns?ns=shop")
    assert page.status_code == 200
    assert 'href="/ops/runs/static/style.css"' in page.text
    assert 'data-events="/ops/runs/events?ns=shop"' in page.text
    assert web(outer).get("/ops/runs/static/live.js").status_code == 200


# ------------------------------------------------------------------------ on the wire


@pytest.mark.server
def test_on_the_wire_every_page_sends_bounded_commands_only(own_redis7: Any) -> None:
    """MONITOR on a private server: what each page sends, the store's scripts included.
    No KEYS, no SCAN, nothing that reads a whole key but the run's own script."""
    client = own_redis7.client()
    store = RedisRunStore(client, namespace="wire", discover=json_wait)
    store.insert("held", b'{"n": 1}', Claim("node-a", 60_000))
    for i in range(60):
        store.insert(f"r-{i:02d}", b'{"wait": {"at": 0}}', Release())
    board = app(client, namespaces=["wire"])
    seen: list[str] = []
    monitor = own_redis7.client().monitor()
    stop = threading.Event()

    def watch() -> None:
        with monitor as m:
            for command in m.listen():
                seen.append(command["command"])
                if stop.is_set() and "ping-end" in command["command"]:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.2)
    browser = web(board)
    pages = ["/", "/ns?ns=wire", "/owners?ns=wire", "/runs?ns=wire&state=ready_now",
             "/runs?ns=wire&state=held_live", "/runs?ns=wire&state=quarantined",
             "/run?ns=wire&id=held", "/metrics"]
    for path in pages:
        assert browser.get(path).status_code == 200
    stop.set()
    client.echo("ping-end")
    watcher.join(10)
    names = [c.split()[0].upper() for c in seen if c]
    assert "KEYS" not in names and "SCAN" not in names and "FLUSHALL" not in names
    assert not {"HGETALL", "SMEMBERS", "LRANGE", "ZRANGEBYLEX"} & set(names)
    assert {"ZCOUNT", "ZRANGE", "EVALSHA"} <= set(names)
    for command in seen:
        if command.upper().startswith("ZRANGE") and "BYSCORE" in command.upper():
            assert "LIMIT 0" in command.upper(), command
    store.close()
    redis.Redis.close(client)


@pytest.mark.parametrize("partitions", [1, 3])
def test_the_source_reads_a_namespaces_change_feed(partitions: int) -> None:
    """Where the namespace records a change feed, the live reader's ``changes`` and a run
    page's ``events`` come from it (``None``: from now); elsewhere ``NoFeed`` and none."""
    from redisstore import Feed

    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace="fed", partitions=partitions, feed=Feed())
    store.insert("old", b"x", Release())
    source = StoreSource(client, ["fed", "plain"])
    assert source.changes("fed", None) == []  # from now: not the older entries
    store.insert("job", b"x", Claim("node", 60_000))
    store.compare_and_set("job", 1, b"y", Hold("node"))
    changes = source.changes("fed", None)  # from where the last read from now ended
    assert [(c.run, c.kind) for c in changes] == [("job", "inserted"), ("job", "written")]
    store.release("node", ["job"])
    assert [(c.run, c.kind) for c in source.changes("fed", changes[-1].cursor)] == [
        ("job", "released")]
    recent = source.events("fed", "job")
    assert [(c.kind, c.revision, c.owner) for c in recent] == [
        ("released", 2, "node"), ("written", 2, "node"), ("inserted", 1, "node")]
    RedisRunStore(client, namespace="plain").insert("a", b"x", Release())
    with pytest.raises(NoFeed):
        source.changes("plain", None)
    assert source.events("plain", "a") == []
