"""Serving the dashboard with uvicorn: in the foreground (the command) or on a thread."""

from __future__ import annotations

import signal
import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn's server, which also tells the dashboard's feed to end its event streams
    when it is told to stop (Ctrl-C): a graceful shutdown waits for every open response,
    and a page's stream would never end by itself."""

    def __init__(self, asgi: Any) -> None:
        super().__init__(uvicorn.Config(asgi, log_level="warning", lifespan="off",
                                        timeout_graceful_shutdown=2))
        self.asgi = asgi
        #: The signals that stopped it (the command's Ctrl-C: see :meth:`run_in_foreground`).
        self.signals: list[int] = []

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.signals.append(sig)
        self.stop_streams()
        super().handle_exit(sig, frame)

    def run_in_foreground(self, sockets: list[socket.socket]) -> None:
        """Serve until a signal; Ctrl-C raises ``KeyboardInterrupt`` once it has stopped.
        uvicorn raises the signal again after its shutdown, but asyncio's runner may take
        that as a cancel of its main task just as the task ends, and return normally: the
        command would then exit 0, not 130."""
        self.run(sockets=sockets)
        if signal.SIGINT in self.signals:
            raise KeyboardInterrupt

    def stop_streams(self) -> None:
        board = getattr(self.asgi, "dashboard", None)
        if board is not None:
            board.feed.closing.set()


def server(asgi: Any) -> _Server:
    """A uvicorn server of ``asgi``: quiet, no lifespan (the app starts what it needs on
    its first page); stopping it ends the open event streams."""
    return _Server(asgi)


class Background:
    """``asgi`` served on a free port of ``host`` (or on ``port``: the same one again, as a
    restarted server would be) by a thread, for tests and the screenshots:
    ``with Background(app) as running: running.url``."""

    def __init__(self, asgi: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self._socket = socket.create_server((host, port))
        self.url = f"http://{host}:{self._socket.getsockname()[1]}"
        self._server = server(asgi)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]}, daemon=True,
                                        name="redisstore-dashboard")

    def __enter__(self) -> Background:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._server.stop_streams()
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()
