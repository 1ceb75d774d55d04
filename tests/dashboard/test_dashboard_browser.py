"""The dashboard in a real browser: Chromium (the system's, through Playwright) against the
dashboard served on a free loopback port over a private Redis. Every view, every action,
a live update on screen without a reload, markup in ids and records shown as text, and
the refusals: cross-site, read-only, a stale page.

Needs ``chromium`` on PATH (Debian: ``apt-get install chromium``; Playwright's own browser
download is not used) and the test extra (Playwright for Python).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from servers import REQUIRE, Server, missing, redis_binary, start, unique_namespace

from redisstore import Claim, Failure, Feed, Fenced, Hold, NotFound, RedisRunStore, Release
from redisstore.admin.namespaces import drop_namespace
from redisstore.dashboard import app
from redisstore.dashboard.serving import Background
from redisstore.discovery import json_wait

pytestmark = [pytest.mark.server, pytest.mark.browser]

TOKEN = "browser-test-token-0123456789"
#: How soon a change must show on an open page.
LIVE_WITHIN_MS = 2_000


@pytest.fixture(scope="module")
def dashboard_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start(redis_binary(), "redis-server (Redis 7)", tmp_path_factory.mktemp("dash"))
    yield server
    server.stop()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    binary = shutil.which("chromium")
    if binary is None:
        missing("no chromium on PATH (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if REQUIRE:
            raise
        pytest.skip("Playwright is not installed (the test extra has it)")
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=binary)
        yield browser
        browser.close()


@dataclass
class Site:
    """A namespace with one run in each state, and the dashboard over it twice: with
    actions (``url``) and read-only (``ro_url``), on two ports (two origins)."""

    url: str
    ro_url: str
    ns: str
    store: RedisRunStore
    client: redis.Redis


@pytest.fixture
def site(dashboard_server: Server) -> Iterator[Site]:
    client = dashboard_server.client()
    ns = unique_namespace("dash")
    store = RedisRunStore(client, namespace=ns, discover=json_wait)
    store.insert("failed-1", b'{"wait": {"at": 0}}', Release())
    job = store.claim("node-c", ttl=60_000, records=True)[0]
    assert job.current.token is not None
    store.finish("failed-1", 1, Fenced("node-c", job.current.token),
                 failure=Failure("KeyError: 'customer'", final=True))
    store.insert("held-2", b'{"n": 2}', Claim("node-b", 100))
    store.insert("held-1", b'{"n": 1}', Claim("node-a", 600_000))
    store.insert("later-1", b'{"wait": {"at": %d}}' % (store.now() + 3_600_000), Release())
    time.sleep(0.15)  # held-2's lease runs out
    acting = app(client, namespaces=[ns], allow_actions=True, token=TOKEN, label="private")
    reading = app(client, namespaces=[ns], label="private")
    with Background(acting) as running, Background(reading) as read_only:
        yield Site(running.url, read_only.url, ns, store, client)
    store.close()
    drop_namespace(client, ns)


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1200, "height": 800})
    opened = context.new_page()
    opened.set_default_timeout(10_000)
    yield opened
    context.close()


def live(page: Any) -> None:
    """Wait until the page's event stream is open."""
    page.wait_for_selector("#live-status.up")


def log_in(page: Any, site: Site) -> None:
    page.goto(f"{site.url}/login")
    page.fill("input[name=token]", TOKEN)
    page.click("#login")
    page.wait_for_selector("text=log out")


def count(page: Any, state: str) -> str:
    text: str = page.locator(f"[data-count={state}]").first.inner_text()
    return text


def test_every_view(page: Any, site: Site) -> None:
    for i in range(60):
        site.store.insert(f"bulk-{i:02d}", b'{"wait": {"at": 0}}', Release())
    page.goto(site.url)
    live(page)
    row = page.locator("tr", has=page.locator(f"a:text-is('{site.ns}')"))
    assert row.locator("[data-count=ready_now]").inner_text() == "60"
    assert row.locator("[data-count=held_live]").inner_text() == "1"
    assert page.locator(".server").inner_text() == "private"
    page.click("#scan")  # an explicit scan: finds the namespace (and the private server's)
    assert "Last scan:" in page.locator("#scan-result").inner_text()

    page.click(f"a:text-is('{site.ns}')")
    live(page)
    assert count(page, "held_expired") == "1" and count(page, "quarantined") == "1"
    assert count(page, "waiting_time") == "1"
    assert page.locator("#no-rates").is_visible()  # no per-minute counters yet

    page.click("header >> text=owners")
    owners = page.locator("td.owner").all_inner_texts()
    assert owners == ["node-a", "node-b"] and "All 2 held runs" in page.content()

    page.click("header >> text=runs")
    assert page.locator("a.run").all_inner_texts() == ["held-1"]
    page.click(".tabs >> text=held, expired")
    assert page.locator("a.run").all_inner_texts() == ["held-2"]
    page.click(".tabs >> text=waiting for a time")
    assert page.locator("a.run").all_inner_texts() == ["later-1"]
    page.click(".tabs >> text=ready now")
    first = page.locator("a.run").all_inner_texts()
    assert first == [f"bulk-{i:02d}" for i in range(50)]
    page.click("#next")
    assert page.locator("a.run").all_inner_texts() == [f"bulk-{i:02d}" for i in range(50, 60)]
    assert page.locator("#next").count() == 0
    page.click(".tabs >> text=quarantined")
    assert "KeyError: 'customer'" in page.locator("td.error").inner_text()
    page.click("a.run:text-is('failed-1')")
    assert page.locator("#quarantined").inner_text() == "failed: KeyError: 'customer'"
    assert page.locator("#attempts").inner_text() == "1"
    assert page.locator("#no-events").is_visible()

    page.fill("header input[name=id]", "held-1")  # look a run up by its exact id
    page.click("header >> text=Find")
    assert page.locator("h1").inner_text() == "held-1"
    assert page.locator("#holder").inner_text().startswith("node-a (live, grant ")
    assert page.locator("#revision").inner_text() == "1"
    assert "{\n  \"n\": 1\n}" in page.locator("#record").inner_text()
    page.goto(f"{site.url}/run?ns={site.ns}&id=absent")
    assert page.locator("#missing").is_visible()

    page.goto(f"{site.url}/metrics")
    assert (f'redisstore_runs{{namespace="{site.ns}",state="ready_now"}} 60'
            in page.inner_text("body"))


def test_a_change_shows_within_2_s_without_a_reload(page: Any, site: Site) -> None:
    page.goto(f"{site.url}/ns?ns={site.ns}")
    live(page)
    page.evaluate("window.stillHere = 42")
    assert count(page, "ready_now") == "0"
    written = time.monotonic()
    site.store.insert("new-1", b'{"wait": {"at": 0}}', Release())
    # (A locator's expectation: the page's CSP forbids the eval wait_for_function uses.)
    expect(page.locator("[data-count=ready_now]")).to_have_text("1", timeout=LIVE_WITHIN_MS)
    assert time.monotonic() - written < LIVE_WITHIN_MS / 1000
    assert page.evaluate("window.stillHere") == 42  # the same document: no navigation
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

    # A run's page follows its run: released elsewhere, it shows free.
    page.goto(f"{site.url}/run?ns={site.ns}&id=held-1")
    live(page)
    page.evaluate("window.stillHere = 43")
    site.store.release("node-a", ["held-1"])
    expect(page.locator("#holder")).to_have_text("free", timeout=LIVE_WITHIN_MS)
    assert page.evaluate("window.stillHere") == 43


def _seen(page: Any, want: str) -> list[str]:
    """The page's change events so far, once ``want`` is among them (live.js keeps them)."""
    deadline = time.monotonic() + 15  # a wait's bound, not a speed asserted
    while True:
        seen: list[str] = page.evaluate("window.redisstoreSeen.slice()")
        if want in seen or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def test_a_page_dropped_and_reconnected_to_a_restarted_server_misses_no_change(
        page: Any, dashboard_server: Server) -> None:
    """A namespace with a change feed: its page's stream drops (the dashboard stops), runs
    change while it is away, a new dashboard process comes up on the same port; the page,
    never reloaded, reconnects by itself with its Last-Event-ID and is sent every change
    it missed, once, in order."""
    client = dashboard_server.client()
    ns = unique_namespace("fed")
    store = RedisRunStore(client, namespace=ns, discover=json_wait, feed=Feed())
    store.insert("before", b"{}", Release())
    first = Background(app(client, namespaces=[ns]))
    port = int(first.url.rsplit(":", 1)[1])
    with first:
        page.goto(f"{first.url}/ns?ns={ns}")
        live(page)
        page.evaluate("window.stillHere = 44")
        store.insert("a", b"{}", Release())
        assert _seen(page, "a inserted 1") == ["a inserted 1"]
    page.wait_for_selector("#live-status.down")  # the stream dropped
    store.insert("b", b"{}", Release())
    store.compare_and_set("a", 1, b'{"n": 2}', Release())
    store.insert("c", b"{}", Claim("node-a", 60_000))
    store.release("node-a", ["c"])
    with Background(app(client, namespaces=[ns]), port=port):  # another process
        seen = _seen(page, "c released 1")
        assert seen == ["a inserted 1", "b inserted 1", "a written 2", "c inserted 1",
                        "c released 1"]
        live(page)
        store.insert("d", b"{}", Release())
        assert _seen(page, "d inserted 1")[len(seen):] == ["d inserted 1"]
        assert page.evaluate("window.stillHere") == 44  # the same document throughout
    store.close()
    drop_namespace(client, ns)


def test_every_action(page: Any, site: Site) -> None:
    log_in(page, site)
    page.goto(f"{site.url}/run?ns={site.ns}&id=held-1")
    assert page.locator("#restore").count() == 0  # not quarantined
    page.click("#release")
    assert page.locator(".notice").inner_text() == "Released."
    assert page.locator("#holder").inner_text() == "free"
    assert site.store.get("held-1").token is None

    page.goto(f"{site.url}/run?ns={site.ns}&id=failed-1")
    assert page.locator("#release").count() == 0  # free: nothing to release
    page.click("#restore")
    assert page.locator(".notice").inner_text() == "Restored."
    assert page.locator("#quarantined").inner_text() == "no"
    assert site.store.get("failed-1").quarantined is None

    page.goto(f"{site.url}/run?ns={site.ns}&id=later-1")
    page.click("#delete")
    assert page.locator(".notice").inner_text() == "Deleted run later-1."
    with pytest.raises(NotFound):
        site.store.get("later-1")


def test_a_stale_pages_action_is_refused(page: Any, site: Site) -> None:
    log_in(page, site)
    page.goto(f"{site.url}/run?ns={site.ns}&id=held-1")
    live(page)
    page.evaluate("window.redisstoreLive.close()")  # the page stops following the run
    site.store.compare_and_set("held-1", 1, b'{"n": 1.5}', Hold("node-a"))
    page.click("#release")
    assert "it was written since the page was drawn (revision 2, the page showed 1)" in (
        page.locator("#refusal").inner_text())
    assert page.locator("#now-revision").inner_text() == "2"
    assert page.locator("#now-holder").inner_text() == "node-a"
    assert site.store.get("held-1").token is not None  # still held: nothing was done

    page.goto(f"{site.url}/run?ns={site.ns}&id=held-2")  # expired; taken over meanwhile
    live(page)
    page.evaluate("window.redisstoreLive.close()")
    assert site.store.claim_expired("node-z", 60_000, 10) == ["held-2"]
    page.click("#delete")
    assert "changed hands" in page.locator("#refusal").inner_text()
    assert page.locator("#now-holder").inner_text() == "node-z"
    assert site.store.get("held-2").revision == 1


def test_markup_in_ids_and_records_is_shown_as_text(page: Any, site: Site) -> None:
    run = 'x<img src=x onerror="window.hit=1"><script>window.hit=2</script>'
    record = b'{"wait": {"at": 0}, "note": "</pre><script>window.hit=3</script>"}'
    site.store.insert(run, record, Release())
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(f"{site.url}/runs?ns={site.ns}&state=ready_now")
    assert page.locator("a.run").inner_text() == run
    page.click("a.run")
    assert page.locator("h1").inner_text() == run
    assert "</pre><script>window.hit=3</script>" in page.locator("#record").inner_text()
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    assert page.evaluate("window.hit") is None and dialogs == []


def test_cross_site_and_read_only_posts_are_refused(page: Any, site: Site) -> None:
    # Read-only: no action on any page, and a POST answers 403 whatever it carries.
    page.goto(f"{site.ro_url}/run?ns={site.ns}&id=held-1")
    assert page.locator("form.action").count() == 0
    assert page.locator(".readonly").inner_text() == "read-only"
    page.goto(f"{site.ro_url}/")  # the scan's form: a valid CSRF token of this session
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    status = page.evaluate(
        """async ([url, body]) => (await fetch(url, {method: "POST", body: new
        URLSearchParams(body)})).status""",
        [f"{site.ro_url}/action/release",
         {"csrf": csrf, "ns": site.ns, "id": "held-1", "revision": "1", "owner": "node-a",
          "token": "1"}])
    assert status == 403
    page.goto(f"{site.ro_url}/login")
    assert "read-only" in page.locator("#problem").inner_text()

    # Logged in on the acting dashboard, the operator visits another origin whose page
    # posts a form to it: refused, nothing done.
    log_in(page, site)
    page.goto(f"{site.url}/run?ns={site.ns}&id=held-1")
    fields = {name: page.locator(f"form.action:has(#delete) input[name={name}]")
              .get_attribute("value") for name in ("csrf", "ns", "id", "revision", "owner",
                                                   "token")}
    # (The dashboard's own pages could not: their CSP allows forms to itself only.)
    inputs = "".join(f'<input type="hidden" name="{name}" value="{value}">'
                     for name, value in fields.items())
    attacker = (f'<form id="f" method="post" action="{site.url}/action/delete">{inputs}'
                "</form><script>document.getElementById('f').submit()</script>")
    page.route("http://attacker.test/", lambda route: route.fulfill(
        status=200, content_type="text/html", body=attacker))
    page.goto("http://attacker.test/")
    page.wait_for_selector("#problem")
    assert "another site" in page.locator("#problem").inner_text()
    assert site.store.get("held-1").revision == 1

    # Same origin, logged in, without the CSRF token: refused.
    page.goto(f"{site.url}/run?ns={site.ns}&id=held-1")
    status = page.evaluate(
        """async ([url, body]) => (await fetch(url, {method: "POST", body: new
        URLSearchParams(body)})).status""",
        [f"{site.url}/action/delete", {**fields, "csrf": ""}])
    assert status == 403
    assert site.store.get("held-1").revision == 1


def test_the_docs_screenshots_exist() -> None:
    """docs/dashboard.md shows each view; the script that takes them names each."""
    from redisstore.dashboard.screenshots import SHOTS

    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "dashboard.md").read_text()
    for name in SHOTS:
        assert (docs / f"dashboard-{name}.png").is_file(), name
        assert f"(dashboard-{name}.png)" in text, name
