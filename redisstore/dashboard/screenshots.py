"""The screenshots of docs/dashboard.md: each view of the demo, taken by a real browser.

``python -m redisstore.dashboard.screenshots [--out docs]`` serves the demo (embedded
fakeredis, the demo workload, actions on) on a free loopback port, lets it run a few
seconds, and saves one PNG per view with Playwright driving Chromium (the system's
``chromium`` when there is one). Needs the ``dashboard`` extra and Playwright.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

#: Each shot: its file name (under the output folder) and the page it shows.
SHOTS = ["namespaces", "namespace", "owners", "runs", "quarantine", "run", "escaped",
         "refused"]


def take(out: Path, settle: float = 12.0) -> list[Path]:
    """Take every shot of :data:`SHOTS` into ``out``; the files written."""
    import fakeredis
    from playwright.sync_api import sync_playwright

    from ..core.runs import Hold
    from ..shells.store import RedisRunStore
    from .app import app_of
    from .demo import Workload
    from .serving import Background
    from .source import StoreSource

    token = secrets.token_urlsafe(24)
    client = fakeredis.FakeRedis()
    workload = Workload(client, seed=7, stores=RedisRunStore).start()
    board = app_of(StoreSource(client, [workload.namespace, workload.quiet],
                               label="fakeredis (embedded)"), allow_actions=True, token=token)
    written: list[Path] = []
    out.mkdir(parents=True, exist_ok=True)
    try:
        deadline = time.monotonic() + 60
        time.sleep(settle)
        source = board.dashboard.source
        while (source.counts(workload.namespace).quarantined == 0
               and time.monotonic() < deadline):
            time.sleep(0.5)
        with Background(board) as running, sync_playwright() as play:
            browser = play.chromium.launch(executable_path=shutil.which("chromium"))
            page = browser.new_page(viewport={"width": 1180, "height": 760})
            base = running.url

            def shot(name: str) -> None:
                page.wait_for_selector("#live-status.up")
                path = out / f"dashboard-{name}.png"
                page.screenshot(path=str(path), full_page=True)
                written.append(path)

            page.goto(f"{base}/login")
            page.fill("input[name=token]", token)
            page.click("#login")
            page.click("#scan")
            page.wait_for_selector("#scan-result")
            shot("namespaces")
            ns = workload.namespace
            page.goto(f"{base}/ns?ns={ns}")
            shot("namespace")
            page.goto(f"{base}/owners?ns={ns}")
            shot("owners")
            page.goto(f"{base}/runs?ns={ns}&state=waiting_time")
            shot("runs")
            page.goto(f"{base}/runs?ns={ns}&state=quarantined")
            shot("quarantine")
            page.click("a.run >> nth=0")
            shot("run")
            page.goto(f"{base}/runs?ns={workload.quiet}&state=ready_now")
            page.click("a.run >> nth=0")
            shot("escaped")
            page.goto(f"{base}/run?ns={workload.quiet}&id=invoice-held")
            page.wait_for_selector("#live-status.up")
            page.evaluate("window.redisstoreLive.close()")  # the page goes stale
            held = workload.quiet_store.get("invoice-held")
            workload.quiet_store.compare_and_set("invoice-held", held.revision,
                                                 held.record, Hold("billing-1"))
            page.click("#release")
            page.wait_for_selector("#refusal")
            path = out / "dashboard-refused.png"
            page.screenshot(path=str(path), full_page=True)
            written.append(path)
            browser.close()
    finally:
        workload.stop()
    return written


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m redisstore.dashboard.screenshots",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs", help="the folder (default: docs)")
    args = parser.parse_args(argv)
    for path in take(Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
