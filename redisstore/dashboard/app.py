"""The dashboard's routes: each view, the actions' endpoints, the event stream, /metrics.

:func:`app_of` builds the ASGI app (Starlette) over a :class:`Source`. Pages are rendered
on the server by Jinja2 with autoescape on (every stored value is escaped; no template
marks stored data safe) and served with a Content-Security-Policy that runs no inline
script: the one script, ``static/live.js``, keeps a page up to date from ``/events``. A
request with the header ``X-Fragment: 1`` gets only the page's live part, which that
script swaps in.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .actions import ACTIONS, Guard, read_form, seen_from
from .chart import SERIES, chart
from .live import Feed
from .values import PAGE, STATES, Counts, Source, as_seen, holder_text

HERE = Path(__file__).parent

#: What each state is called on the pages.
STATE_NAMES = {
    "held_live": "held, live",
    "held_expired": "held, expired",
    "ready_now": "ready now",
    "waiting_time": "waiting for a time",
    "quarantined": "quarantined",
}

#: Namespaces /metrics reports at most (in name order): a scrape's cost stays bounded
#: however many a scan found.
METRICS_NAMESPACES = 200

#: Seconds a wrong token's answer waits.
WRONG_TOKEN_PAUSE = 0.5

#: Sent with every response: no inline script or style, no framing, no sniffing.
HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
     b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


class DashboardApp:
    """The ASGI app :func:`app_of` makes: its routes, with :data:`HEADERS` added to every
    response (pure ASGI: the event stream stays a stream). ``dashboard`` is its state."""

    def __init__(self, inner: ASGIApp, dashboard: Dashboard,
                 hosts: Iterable[str] | None = None) -> None:
        self.inner = inner
        self.dashboard = dashboard
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hosts is not None and scope["type"] == "http" and (
                _host(scope) not in self.hosts):
            # Another name for this address (DNS rebinding: a page of another site whose
            # name now points here would read the dashboard as its own origin).
            await PlainTextResponse("unknown host", status_code=400)(scope, receive, send)
            return
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.inner(scope, receive, sending)


def _host(scope: Scope) -> str:
    """The request's Host header without its port, lower-case."""
    for name, value in scope.get("headers", []):
        if name == b"host":
            host: str = bytes(value).decode("latin-1").lower()
            if host.startswith("["):
                return host[1:].split("]", 1)[0]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return ""


def _duration(ms: int | None) -> str:
    """``ms`` as a person reads it: 850 ms, 12.3 s, 4 min 10 s, 3 h 2 min."""
    if ms is None:
        return "-"
    size = abs(ms)
    if size < 1000:
        text = f"{size} ms"
    elif size < 60_000:
        text = f"{size / 1000:.1f} s"
    elif size < 3_600_000:
        text = f"{size // 60_000} min {size % 60_000 // 1000} s"
    else:
        text = f"{size // 3_600_000} h {size % 3_600_000 // 60_000} min"
    return text


def _relative(at: int | None, now: int) -> str:
    """A backend time relative to ``now``: "in 3.0 s", "2.1 s ago"."""
    if at is None:
        return "-"
    delta = at - now
    return f"in {_duration(delta)}" if delta > 0 else f"{_duration(delta)} ago"


def _utc(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def environment() -> jinja2.Environment:
    """The templates, autoescaped (every ``{{ }}`` is HTML-escaped), undefined names an
    error. ``q`` quotes a value for a URL's query."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["duration"] = _duration
    env.filters["utc"] = _utc
    env.globals["relative"] = _relative
    env.globals["STATE_NAMES"] = STATE_NAMES
    return env


class Dashboard:
    """The app's state: its source, feed, guard and templates; each route is a method."""

    def __init__(self, source: Source, guard: Guard, hide: Callable[[str], str]) -> None:
        self.source = source
        self.guard = guard
        self.hide = hide
        self.feed = Feed(source, hide=hide)
        self.env = environment()

    # ---------------------------------------------------------------- rendering

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> Response:
        base = str(request.scope.get("root_path", "")).rstrip("/")
        session, new = self.guard.session(request)
        fragment = request.headers.get("x-fragment") == "1"
        context.setdefault("title", "redisstore")
        context.setdefault("ns", None)
        context.setdefault("run_id", "")
        context.setdefault("notice", None)
        ns = context["ns"]
        # A page that is an answer to a POST (a refusal, a problem) is not kept live: it
        # has no URL to fetch again.
        live = context.pop("live", template not in ("refused.html", "problem.html",
                                                    "login.html"))
        events = (f"{base}/events" + (f"?{urlencode({'ns': ns})}" if ns else "")) if live else ""
        html = self.env.get_template(template).render(
            base=base, csrf=self.guard.csrf(session), fragment=fragment,
            label=self.source.label, actions=self.guard.allow_actions,
            logged_in=self.guard.logged_in(request), events_url=events, PAGE=PAGE,
            **context)
        response = HTMLResponse(html, status_code=status)
        if new:
            self.guard.set_session(response, request, session, base)
        return response

    def problem(self, request: Request, exc: Exception, status: int = 503) -> Response:
        return self.render(request, "problem.html", status, title="problem",
                           message=self.hide(f"{type(exc).__name__}: {exc}"))

    def _namespace(self, request: Request, name: str = "ns") -> str:
        from ..core.keys import check_namespace

        return check_namespace(request.query_params.get(name, ""))

    # ---------------------------------------------------------------- views

    def namespaces(self, request: Request) -> Response:
        names = self.source.namespaces()
        rows: list[tuple[str, Counts | None, str | None]] = []
        for name in names[:50]:
            try:
                rows.append((name, self.source.counts(name), None))
            except Exception as exc:
                rows.append((name, None, self.hide(f"{type(exc).__name__}: {exc}")))
        return self.render(request, "namespaces.html", title="namespaces", rows=rows,
                           more=len(names) - len(rows), scan=self.source.last_scan(),
                           scanned=request.query_params.get("scanned") == "1")

    def namespace(self, request: Request) -> Response:
        try:
            ns = self._namespace(request)
            counts = self.source.counts(ns)
            rates = self.source.rates(ns)
        except Exception as exc:
            return self.problem(request, exc)
        scan = self.source.last_scan()
        deps = scan.namespaces.get(ns) if scan else None
        deleted = request.query_params.get("deleted")
        return self.render(request, "namespace.html", title=ns, ns=ns, counts=counts,
                           chart=chart(rates or []), counted=rates is not None, deps=deps,
                           scan=scan,
                           notice=f"Deleted run {deleted}." if deleted else None)

    def owners(self, request: Request) -> Response:
        try:
            ns = self._namespace(request)
            got = self.source.owners(ns, request.query_params.get("after") or None)
        except Exception as exc:
            return self.problem(request, exc)
        return self.render(request, "owners.html", title=f"{ns}: owners", ns=ns, owners=got,
                           after=request.query_params.get("after"))

    def runs(self, request: Request) -> Response:
        state = request.query_params.get("state", "held_live")
        after = request.query_params.get("after") or None
        try:
            ns = self._namespace(request)
            if state not in STATES:
                raise ValueError(f"no such state: {state!r}")
            counts = self.source.counts(ns)
            if state == "quarantined":
                page: Any = self.source.quarantine(ns, after)
            else:
                page = self.source.listing(ns, state, after)
        except Exception as exc:
            return self.problem(request, exc, 400 if isinstance(exc, ValueError) else 503)
        return self.render(request, "runs.html", title=f"{ns}: {STATE_NAMES[state]}", ns=ns,
                           state=state, page=page, counts=counts, after=after)

    def run(self, request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        try:
            ns = self._namespace(request)
            if not run_id:
                raise ValueError("give a run's id")
            view = self.source.run(ns, run_id)
            events = self.source.events(ns, run_id) if view else []
        except Exception as exc:
            return self.problem(request, exc, 400 if isinstance(exc, ValueError) else 503)
        done = request.query_params.get("done")
        notice = f"{done.capitalize()}." if done in ("released", "restored") else None
        return self.render(request, "run.html", 200 if view else 404,
                           title=f"{ns}: {run_id}", ns=ns, run_id=run_id, view=view,
                           events=events, notice=notice,
                           seen=as_seen(view.current) if view else None,
                           holder=holder_text(view.current) if view else None)

    def metrics(self, request: Request) -> Response:
        lines = ["# HELP redisstore_runs Runs by state, read from the namespace's indexes.",
                 "# TYPE redisstore_runs gauge"]
        failed = []
        names = self.source.namespaces()[:METRICS_NAMESPACES]
        for ns in names:
            try:
                counts = self.source.counts(ns)
            except Exception:
                failed.append(ns)
                continue
            for state, value in counts.by_state().items():
                lines.append(f'redisstore_runs{{namespace="{_label(ns)}",state="{state}"}} '
                             f"{value}")
        lines += ["# HELP redisstore_namespace_up 1 when the namespace could be read.",
                  "# TYPE redisstore_namespace_up gauge"]
        for ns in names:
            lines.append(f'redisstore_namespace_up{{namespace="{_label(ns)}"}} '
                         f"{0 if ns in failed else 1}")
        lines += self._work_metrics([ns for ns in names if ns not in failed])
        return PlainTextResponse("\n".join(lines) + "\n",
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    def _work_metrics(self, names: list[str]) -> list[str]:
        """The per-minute counts of each namespace that keeps them (a feed): the last
        complete minute's, and the hour's (the 60 minutes the store keeps, this one
        included). Gauges: a minute's count is not a running total."""
        minute, hour = [], []
        for ns in names:
            try:
                rates = self.source.rates(ns)
            except Exception:
                continue  # the namespace's up gauge says whether it could be read
            if not rates:
                continue
            last = rates[-2] if len(rates) > 1 else rates[-1]
            for kind in SERIES:
                label = f'namespace="{_label(ns)}",kind="{kind}"'
                minute.append(f"redisstore_work_last_minute{{{label}}} {getattr(last, kind)}")
                hour.append(f"redisstore_work_last_hour{{{label}}} "
                            f"{sum(getattr(r, kind) for r in rates)}")
        if not minute:
            return []
        return ["# HELP redisstore_work_last_minute Runs claimed (kind=claims, takeovers "
                "included), grants finished (finishes) and expired leases taken over "
                "(takeovers) in the last complete minute, counted by the store's scripts in "
                "namespaces with a change feed.",
                "# TYPE redisstore_work_last_minute gauge", *minute,
                "# HELP redisstore_work_last_hour The same over the last 60 minutes, this one "
                "included.",
                "# TYPE redisstore_work_last_hour gauge", *hour]

    # ---------------------------------------------------------------- posts

    def _read_only(self, request: Request) -> Response | None:
        """The 403 every action answers while actions are off, or None."""
        if self.guard.allow_actions:
            return None
        return self.render(request, "problem.html", 403, title="read-only",
                           message="this dashboard is read-only: actions are off")

    async def _same_site_form(self, request: Request
                              ) -> tuple[dict[str, str], Response | None]:
        """A POST's form, and the 403 of a cross-site one (its Origin or its CSRF token),
        or None."""
        form = await read_form(request)
        refused = self.guard.cross_site(request, form)
        if refused:
            return form, self.render(request, "problem.html", 403, title="refused",
                                     message=refused)
        return form, None

    async def scan(self, request: Request) -> Response:
        _, refusal = await self._same_site_form(request)
        if refusal is not None:
            return refusal
        try:
            await run_in_threadpool(self.source.scan)
        except Exception as exc:
            return self.problem(request, exc)
        base = str(request.scope.get("root_path", "")).rstrip("/")
        return RedirectResponse(f"{base}/?scanned=1", status_code=303)

    async def login(self, request: Request) -> Response:
        if (closed := self._read_only(request)) is not None:
            return closed
        if request.method == "GET":
            return self.render(request, "login.html", title="log in")
        form, refusal = await self._same_site_form(request)
        if refusal is not None:
            return refusal
        token = form.get("token")
        if not isinstance(token, str) or not self.guard.token_matches(token):
            await asyncio.sleep(WRONG_TOKEN_PAUSE)  # a guess costs time
            return self.render(request, "login.html", 403, title="log in",
                               notice="That is not the token.")
        base = str(request.scope.get("root_path", "")).rstrip("/")
        response = RedirectResponse(f"{base}/", status_code=303)
        self.guard.log_in(response, request, base)
        return response

    async def logout(self, request: Request) -> Response:
        if (closed := self._read_only(request)) is not None:
            return closed
        _, refusal = await self._same_site_form(request)
        if refusal is not None:
            return refusal
        base = str(request.scope.get("root_path", "")).rstrip("/")
        response = RedirectResponse(f"{base}/", status_code=303)
        self.guard.log_out(response, base)
        return response

    async def act(self, request: Request) -> Response:
        """An action's POST: read-only, cross-site, a session not logged in and a malformed
        form are refused (403, 403, 403, 400) before anything is sent to the store."""
        name = request.path_params["action"]
        if (closed := self._read_only(request)) is not None:
            return closed
        form, refusal = await self._same_site_form(request)
        if refusal is not None:
            return refusal
        if not self.guard.logged_in(request):
            return self.render(request, "problem.html", 403, title="log in",
                               message="log in with the operator's token to act")
        if name not in ACTIONS:
            return self.render(request, "problem.html", 404, title="no such action",
                               message=f"no action {name!r}")
        try:
            from ..core.keys import check_namespace

            ns = check_namespace(str(form.get("ns", "")))
            run = str(form.get("id", ""))
            if not run:
                raise ValueError("no run named")
            seen = seen_from(form)
        except (TypeError, ValueError) as exc:
            return self.render(request, "problem.html", 400, title="bad form", message=str(exc))
        try:
            outcome = await run_in_threadpool(getattr(self.source, f"{name}_seen"), ns, run, seen)
        except Exception as exc:
            return self.problem(request, exc)
        base = str(request.scope.get("root_path", "")).rstrip("/")
        if outcome.done and name == "delete":
            return RedirectResponse(f"{base}/ns?{urlencode({'ns': ns, 'deleted': run})}",
                                    status_code=303)
        if outcome.done:
            return RedirectResponse(
                f"{base}/run?{urlencode({'ns': ns, 'id': run, 'done': outcome.reason})}",
                status_code=303)
        view = outcome.now
        return self.render(request, "refused.html", 409, title="refused", ns=ns, run_id=run,
                           action=name, reason=outcome.reason, view=view,
                           holder=holder_text(view.current) if view else None)

    async def events(self, request: Request) -> Response:
        ns = request.query_params.get("ns") or None
        if ns is not None:
            try:
                ns = self._namespace(request)
            except ValueError as exc:
                return PlainTextResponse(str(exc), status_code=400)
        stream = self.feed.stream(ns, request.headers.get("last-event-id"))
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"cache-control": "no-store",
                                          "x-accel-buffering": "no"})


def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def app_of(source: Source, *, allow_actions: bool = False, token: str | None = None,
           hide: Callable[[str], str] | None = None,
           hosts: Iterable[str] | None = None) -> DashboardApp:
    """The dashboard's pages over ``source`` as an ASGI app: what
    :func:`redisstore.dashboard.app` makes once it has a source (its docstring says what
    each option does). The pages stand on the :class:`Source` seam alone, not on the
    stores a :class:`~redisstore.dashboard.source.StoreSource` reads through."""
    board = Dashboard(source, Guard(allow_actions=allow_actions, token=token),
                      hide or (lambda text: text))
    routes = [
        Route("/", board.namespaces),
        Route("/scan", board.scan, methods=["POST"]),
        Route("/ns", board.namespace),
        Route("/owners", board.owners),
        Route("/runs", board.runs),
        Route("/run", board.run),
        Route("/metrics", board.metrics),
        Route("/events", board.events),
        Route("/login", board.login, methods=["GET", "POST"]),
        Route("/logout", board.logout, methods=["POST"]),
        Route("/action/{action}", board.act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return DashboardApp(Starlette(routes=routes), board, hosts)

