"""The command line: the demo runs on the embedded default and on a server, takes its URL
from ``--url`` or ``REDISSTORE_URL``, and never prints a credential, on success or failure."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from servers import EPHEMERAL, Server, missing, redis_binary

from redisstore import acl_rule, cli


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch, env: str | None = None
        ) -> tuple[int, str]:
    out = io.StringIO()
    if env is None:
        monkeypatch.delenv("REDISSTORE_URL", raising=False)
    else:
        monkeypatch.setenv("REDISSTORE_URL", env)
    monkeypatch.setattr("sys.stdout", out)
    code = cli.main(argv)
    return code, out.getvalue()


def test_the_demo_runs_on_the_embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = run(["demo"], monkeypatch)
    assert code == 0 and "fakeredis (embedded)" in out and "node-b claims" in out


@pytest.mark.parametrize("url, shown", [
    ("redis://:s3cr3t@127.0.0.1:1/0", "redis://***@127.0.0.1:1/0"),
    ("rediss://alice:s3cr3t@example.invalid:6380/2", "rediss://***@example.invalid:6380/2"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://alice:s3cr3t@[::1]:7/0", "redis://***@[::1]:7/0"),
    ("redis://127.0.0.1:1/0?password=s3cr3t&db=0", "redis://127.0.0.1:1/0?password=***&db=0"),
    ("redis://alice:s3#cr/3t@127.0.0.1:1/0", "redis://***@127.0.0.1:1/0"),
])
def test_redact_hides_the_user_info(url: str, shown: str) -> None:
    assert cli.redact(url) == shown


@pytest.mark.parametrize("url", [
    "redis://alice:s3cr3t@127.0.0.1:1/0",  # nothing listens on port 1
    "redis://alice:s3cr3t@127.0.0.1:99999/0",  # a port out of range
    "redis://alice:s3#cr3t@127.0.0.1:1/0",  # an unescaped # in the password
    "redis://127.0.0.1:1/0?username=alice&password=s3cr3t",
    "redis://alice:s3%40cr3t@127.0.0.1:1/0",  # percent-encoded: s3@cr3t
])
@pytest.mark.parametrize("by_env", [False, True])
def test_a_failure_names_the_server_but_never_the_password(
        monkeypatch: pytest.MonkeyPatch, by_env: bool, url: str) -> None:
    code, out = run(["demo"] if by_env else ["demo", "--url", url], monkeypatch,
                    env=url if by_env else None)
    assert code == 2 and "demo failed" in out and "127.0.0.1" in out
    for secret in ("s3cr3t", "s3#cr3t", "s3@cr3t", "s3%40cr3t", "alice"):
        assert secret not in out


@pytest.mark.server
def test_on_a_server_as_a_confined_user_the_password_is_never_printed(
        monkeypatch: pytest.MonkeyPatch, redis7: Server) -> None:
    user, password = f"demo-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    # The demo's namespaces are "demo-<hex>": a user confined to that pattern's prefix.
    rule = acl_rule("x").replace("~{x}:*", "~{demo-*")
    redis7.client().execute_command("ACL", "SETUSER", user, "on", f">{password}", *rule.split())
    url = f"redis://{user}:{password}@127.0.0.1:{redis7.port}/0"
    code, out = run(["demo"], monkeypatch, env=url)
    assert code == 0, out
    assert password not in out and user not in out and "***@127.0.0.1" in out
    # A wrong password: refused, and neither password shown.
    code, out = run(["demo", "--url", url.replace(password, "wrong-" + password)],
                    monkeypatch)
    assert code == 2 and password not in out


def test_version_says_the_package_version() -> None:
    import subprocess
    import sys

    import redisstore

    done = subprocess.run([sys.executable, "-m", "redisstore", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.strip() == f"redisstore {redisstore.__version__}"


@pytest.mark.server
def test_demo_keep_inspect_and_drop_as_a_user_would(monkeypatch: pytest.MonkeyPatch,
                                                    redis7: Server) -> None:
    import json

    url = f"redis://127.0.0.1:{redis7.port}/0"
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    code, out = run(["demo", "--url", url, "--namespace", namespace, "--keep"], monkeypatch)
    assert code == 0 and f"kept namespace '{namespace}'" in out
    code, out = run(["inspect", "--url", url, "--namespace", namespace, "--json"], monkeypatch)
    summary = json.loads(out)
    assert code == 0 and summary["namespace"] == namespace and summary["runs"] == 2
    code, out = run(["inspect", "--url", url, "--namespace", namespace, "order-42"],
                    monkeypatch)
    assert code == 0 and "revision" in out and "3" in out
    code, out = run(["drop", "--url", url, "--namespace", namespace], monkeypatch)
    assert code == 2 and "--yes" in out
    assert redis7.client().exists(f"{{{namespace}}}:r:order-42") == 1  # nothing deleted
    code, out = run(["drop", "--url", url, "--namespace", namespace, "--yes"], monkeypatch)
    assert code == 0 and "deleted" in out
    assert list(redis7.client().scan_iter(match=f"{{{namespace}}}:*")) == []
    # Without --keep the demo leaves nothing behind.
    other = f"cli-{uuid.uuid4().hex[:8]}"
    code, out = run(["demo", "--url", url, "--namespace", other], monkeypatch)
    assert code == 0 and "removed the" in out
    assert list(redis7.client().scan_iter(match=f"{{{other}}}:*")) == []


@pytest.mark.server
def test_inspect_doctor_and_drop_see_every_partition_of_a_namespace(monkeypatch: pytest.MonkeyPatch,
                                                             redis7: Server) -> None:
    """A namespace of partitions: inspect counts the runs and indexes of every partition
    and shows a run from its own; doctor says the store runs over them; drop deletes the
    partitions' keys too (it left them)."""
    import json

    from redisstore import Claim, RedisRepository, RedisRunStore, Release

    url = f"redis://127.0.0.1:{redis7.port}/0"
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    store = RedisRunStore(redis7.client(), namespace=namespace, partitions=4)
    for i in range(10):
        store.insert(f"r{i}", b"x", Claim("me", 600_000) if i < 3 else Release())
    RedisRepository(redis7.client(), namespace=namespace, partitions=4).register_group("g")
    code, out = run(["inspect", "--url", url, "--namespace", namespace, "--json"], monkeypatch)
    summary = json.loads(out)
    assert code == 0 and (summary["partitions"], summary["runs"], summary["held"]) == (4, 10, 3)
    assert summary["repository_partitions"] == 4
    code, out = run(["inspect", "--url", url, "--namespace", namespace, "r1", "--json"],
                    monkeypatch)
    one = json.loads(out)
    assert code == 0 and one["holder"] == "me" and 0 < one["lease_ms_left"] <= 600_000
    code, out = run(["doctor", "--url", url, "--namespace", namespace], monkeypatch)
    assert f"OK     namespace '{namespace}' over 4 partitions: the store runs; run layout 4" \
        in out  # (not "layout 1, migrate": it read the namespace's own keys)
    assert "its instance repository is spread over 4 partitions" in out
    code, out = run(["drop", "--url", url, "--namespace", namespace, "--yes"], monkeypatch)
    assert code == 0
    assert list(redis7.client().scan_iter(match=f"{{{namespace}*")) == []


def test_inspect_of_a_closed_port_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = run(["inspect", "--url", "redis://alice:s3cr3t@127.0.0.1:1/0", "--namespace",
                     "x"], monkeypatch)
    assert code == 2 and out.count("\n") == 1 and "Traceback" not in out
    assert "s3cr3t" not in out and "inspect failed" in out


def test_inspect_and_drop_need_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDISSTORE_URL", raising=False)
    for argv in (["inspect", "--namespace", "x"], ["drop", "--namespace", "x", "--yes"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2


@pytest.mark.server
def test_doctor_passes_a_safe_server_and_blocks_an_evicting_one(
        monkeypatch: pytest.MonkeyPatch, redis7: Server, tmp_path: Any) -> None:
    import json

    from servers import EPHEMERAL, redis_binary, start

    code, out = run(["doctor", "--url", f"redis://127.0.0.1:{redis7.port}/0", "--json"],
                    monkeypatch)
    findings = json.loads(out)
    assert code == 0, out
    assert {f["severity"] for f in findings} <= {"ok", "info", "warn"}
    assert any("TIME works" in f["finding"] for f in findings)
    evicting = start(redis_binary(), "redis-server (evicting)", tmp_path / "evicting",
                     (*EPHEMERAL, "--maxmemory-policy", "allkeys-lru", "--hz", "1"))
    try:
        code, out = run(["doctor", "--url", f"redis://127.0.0.1:{evicting.port}/0"],
                        monkeypatch)
    finally:
        evicting.stop()
    assert code == 1, out
    assert "BLOCK  maxmemory-policy allkeys-lru" in out and "noeviction" in out
    assert "WARN   hz 1" in out


@pytest.mark.server
def test_doctor_as_a_confined_user_says_what_it_cannot_see(
        monkeypatch: pytest.MonkeyPatch, redis7: Server) -> None:
    namespace = f"doc-{uuid.uuid4().hex[:8]}"
    user, password = f"doc-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    redis7.client().execute_command("ACL", "SETUSER", user, "on", f">{password}",
                                    *acl_rule(namespace).split())
    url = f"redis://{user}:{password}@127.0.0.1:{redis7.port}/0"
    code, out = run(["doctor", "--url", url, "--namespace", namespace], monkeypatch)
    assert code == 0, out
    assert "INFO is not allowed" in out and "eviction policy cannot be read" in out
    assert f"namespace '{namespace}': the store runs" in out and password not in out
    code, out = run(["doctor", "--url", url, "--namespace", "someone-else"], monkeypatch)
    assert code == 1 and "BLOCK" in out and "acl_rule" in out


def test_bench_prints_a_row_per_operation_and_cleans_up(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Any) -> None:
    import importlib.util
    import json

    code, out = run(["bench", "--ops", "5", "--json"], monkeypatch)
    rows = json.loads(out)
    assert code == 0 and len(rows) == 8
    assert all(r["calls"] == 5 and 0 < r["p50"] <= r["p99"] <= r["worst"] for r in rows)
    code, out = run(["bench", "--ops", "5"], monkeypatch)
    assert code == 0 and "pipeline: write + claim next" in out and "p99 µs" in out
    png = tmp_path / "bench.png"
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(SystemExit) as exited:  # said before anything runs
            run(["bench", "--ops", "3", "--plot", str(png)], monkeypatch)
        assert exited.value.code == 2
    else:
        code, out = run(["bench", "--ops", "3", "--plot", str(png)], monkeypatch)
        assert code == 0 and png.stat().st_size > 0


@pytest.mark.server
def test_bench_on_a_server_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch,
                                                 redis7: Server) -> None:
    before = set(redis7.client().scan_iter(match="{bench-*"))
    code, out = run(["bench", "--url", f"redis://127.0.0.1:{redis7.port}/0", "--ops", "5"],
                    monkeypatch)
    assert code == 0, out
    assert set(redis7.client().scan_iter(match="{bench-*")) == before


@pytest.mark.parametrize("user, password", [("app", "s3cr3t"), ("redis", "ed")])
def test_credentials_are_hidden_as_tokens_and_words_stay_whole(user: str, password: str) -> None:
    url = f"redis://{user}:{password}@127.0.0.1:1/0"
    message = (f"nothing was applied: the ACL user {user} lacks a command the store needs "
               f"(AUTH {user} {password} refused)")
    shown = cli.hide(message, url)
    assert f" {password} " not in shown and f" {user} " not in shown
    assert "nothing was applied" in shown and "the store needs" in shown


def test_doctor_on_a_closed_port_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = run(["doctor", "--url", "redis://127.0.0.1:1/0"], monkeypatch)
    assert code == 2 and out.count("\n") == 1 and "doctor failed" in out


def test_clock_skew_warns_past_50_ms_beyond_the_round_trips() -> None:
    assert cli.clock_skew([("a", 3.0, 0.2)])[0] == "ok"
    close = cli.clock_skew([("a", 3.0, 0.4), ("b", 12.0, 0.2), ("c", -1.0, 0.3)])
    assert close[0] == "ok" and "13.0 ms apart" in close[1]
    far = cli.clock_skew([("a", 0.0, 0.4), ("b", 80.0, 0.2)])
    assert far[0] == "warn" and "80.0 ms apart" in far[1] and "NTP" in far[2]
    # 60 ms apart, but a 30 ms round trip leaves it unsure by 15: no warning.
    assert cli.clock_skew([("a", 0.0, 30.0), ("b", 60.0, 0.2)])[0] == "ok"


def _interrupted(argv: list[str], after: str | None) -> tuple[int, str]:
    """Run ``redisstore argv`` in a process of its own, send it Ctrl-C (SIGINT) once its
    output shows ``after`` (None: after 2 s); its exit code and everything it printed."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    done = subprocess.Popen([sys.executable, "-m", "redisstore", *argv], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert done.stdout is not None
    seen: list[str] = []
    timer = threading.Timer(30, done.kill)
    timer.start()
    try:
        if after is None:
            time.sleep(2)
            done.send_signal(signal.SIGINT)
        for line in done.stdout if after is not None else ():
            seen.append(line)
            if after in line:
                done.send_signal(signal.SIGINT)
                break
        seen.append(done.stdout.read())
        return done.wait(), "".join(seen)
    finally:
        timer.cancel()


@pytest.mark.server
@pytest.mark.parametrize(("argv", "after"), [
    (["demo"], "node-a renews"), (["bench", "--ops", "100000"], None)])
def test_ctrl_c_is_one_line_and_leaves_nothing_behind(redis7: Server, argv: list[str],
                                                      after: str | None) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    url = f"redis://127.0.0.1:{redis7.port}/0"
    code, out = _interrupted([*argv, "--url", url, "--namespace", namespace], after)
    assert code == cli.INTERRUPTED, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert out.splitlines()[-1] == f"redisstore {argv[0]}: interrupted", out
    assert out.count("interrupted") == 1, out
    assert list(redis7.client().scan_iter(match=f"{{{namespace}}}:*")) == []


@pytest.mark.server
def test_inspect_of_a_namespace_that_holds_nothing_says_so(monkeypatch: pytest.MonkeyPatch,
                                                         redis7: Server) -> None:
    url = f"redis://127.0.0.1:{redis7.port}/0"
    code, out = run(["inspect", "--url", url, "--namespace", "no-such-namespace"], monkeypatch)
    assert code == 1 and "has no keys" in out and "no-such-namespace" in out


@pytest.mark.parametrize("command", ["demo", "inspect", "doctor", "bench", "drop"])
def test_an_empty_namespace_is_refused_with_the_commands_usage(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: str) -> None:
    monkeypatch.setenv("REDISSTORE_URL", "redis://127.0.0.1:1/0")
    with pytest.raises(SystemExit) as exited:
        cli.main([command, "--namespace", ""])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert f"usage: redisstore {command}" in err and "must not be empty" in err


def test_a_server_that_needs_a_password_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis

    def refuse(url: str) -> Any:
        raise redis.exceptions.AuthenticationError(
            "HELLO must be called with the client already authenticated, otherwise the "
            "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client "
            "and select the RESP protocol version at the same time")

    monkeypatch.setattr("redis.Redis.from_url", refuse)
    code, out = run(["inspect", "--url", "redis://127.0.0.1:6390/0", "--namespace", "x"],
                    monkeypatch)
    assert code == 2 and out.count("\n") == 1, out
    assert "the server requires a password" in out and "HELLO" not in out, out


@pytest.mark.parametrize("argv", [["inspect", "--namespace", "x", "--bogus"], ["demo", "--bogus"],
                                  ["drop", "--namespace", "x", "--yes", "extra"]])
def test_an_unknown_argument_is_refused_with_the_commands_usage(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str]) -> None:
    """argparse reports a subcommand's unknown arguments from the top-level parser, whose
    usage line says nothing of the subcommand's options."""
    monkeypatch.setenv("REDISSTORE_URL", "redis://127.0.0.1:1/0")
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert f"usage: redisstore {argv[0]}" in err and "unrecognized arguments" in err
    assert argv[-1] in err


@pytest.mark.server
def test_a_server_that_needs_a_password_says_how_to_give_it(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """No password, or a wrong one, on a server that needs one: one line that says so and
    how to give it, for every command that reaches a server (not redis-py's text about
    HELLO), and never the password."""
    binary = redis_binary()
    if binary is None:
        missing("no redis-server binary on this machine")
    assert binary is not None
    server = Server(binary, tmp_path, (*EPHEMERAL, "--requirepass", "s3cr3t"),
                    connect={"password": "s3cr3t"}).start()
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        for argv in (["demo"], ["inspect", "--namespace", "x"], ["doctor"],
                     ["bench", "--ops", "5"], ["drop", "--namespace", "x", "--yes"]):
            code, out = run([*argv, "--url", url], monkeypatch)
            failure = out.splitlines()[-1]
            assert code == 2, out
            assert f"redisstore {argv[0]} failed on {url}: the server requires a password" \
                in failure, out
            assert "redis://:PASSWORD@" in failure and "$REDISSTORE_URL" in failure, out
            assert "HELLO" not in out, out
        wrong = f"redis://:wr0ng@127.0.0.1:{server.port}/0"
        code, out = run(["inspect", "--namespace", "x", "--url", wrong], monkeypatch)
        assert code == 2 and out.count("\n") == 1, out
        assert "the server refused the URL's user or password" in out and "wr0ng" not in out
        assert list(server.client().scan_iter()) == []  # nothing was written
    finally:
        server.stop()
