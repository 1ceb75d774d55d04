"""The operator's dashboard: pages over a server's run stores, live, with guarded actions.

``redisstore dashboard --url URL`` serves it (``--demo``: over embedded fakeredis, with a
workload running); :func:`app` builds the ASGI app to mount in your own Starlette or
FastAPI app. Needs the ``dashboard`` extra (``pip install 'redisstore[dashboard]'``).
docs/dashboard.md describes the views, the actions and how they are kept safe.
"""

from .app import app
from .source import StoreSource
from .values import Change, Counts, MinuteCounts, NoFeed, Seen, Source

__all__ = ["Change", "Counts", "MinuteCounts", "NoFeed", "Seen", "Source", "StoreSource",
           "app"]
