"""The operator's dashboard: pages over a server's run stores, live, with guarded actions.

``redisstore dashboard --url URL`` serves it (``--demo``: over embedded fakeredis, with a
workload running); :func:`app` builds the ASGI app to mount in your own Starlette or
FastAPI app. Needs the ``dashboard`` extra (``pip install 'redisstore[dashboard]'``).
docs/dashboard.md describes the views, the actions and how they are kept safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .app import DashboardApp, app_of
from .source import StoreSource
from .values import Change, Counts, MinuteCounts, NoFeed, Seen, Source

__all__ = ["Change", "Counts", "MinuteCounts", "NoFeed", "Seen", "Source", "StoreSource",
           "app"]


# Here, not in app.py: a client is read through a StoreSource, which stands on the stores;
# the pages (app.py) stand on the Source seam alone, below them.
def app(source: Source | Any, *, namespaces: Iterable[str] = (), allow_actions: bool = False,
        token: str | None = None, label: str = "",
        hide: Callable[[str], str] | None = None,
        hosts: Iterable[str] | None = None) -> DashboardApp:
    """The dashboard as an ASGI app, to serve (``redisstore dashboard``) or mount in your
    own Starlette or FastAPI app (``Mount("/runs", app(client))``).

    ``source``: a :class:`~redisstore.dashboard.values.Source`, or a sync redis-py
    compatible client, read through a
    :class:`~redisstore.dashboard.source.StoreSource` of ``namespaces`` (the ones known
    without a scan; the namespaces page can scan for more). Actions (release, restore,
    delete) are off unless ``allow_actions`` and a ``token``, which an operator gives at
    ``/login``. ``label`` names the server on every page (redact its credentials first:
    :func:`redisstore.admin.cli.redact`); ``hide`` cleans an error's text before a page
    shows it. ``hosts``: the only names a request may give in its Host header (None: any);
    the command gives the loopback names when it listens on a loopback address."""
    if not isinstance(source, Source):
        source = StoreSource(source, namespaces, label=label)
    elif label:
        source.label = label
    return app_of(source, allow_actions=allow_actions, token=token, hide=hide, hosts=hosts)
