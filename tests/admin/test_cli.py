"""The command line: the demo runs on the embedded default and on a server, takes its URL
from ``--url`` or ``REDISSTORE_URL``, and never prints a credential, on success or failure."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
from servers import EPHEMERAL, Server, missing, redis_binary

from redisstore import RedisRunStore, acl_rule, drop_namespace
from redisstore import __main__ as cli


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
def test_inspect_shows_sessions_and_counts_their_runs(monkeypatch: pytest.MonkeyPatch,
                                                      redis7: Server) -> None:
    import json

    url = f"redis://127.0.0.1:{redis7.port}/0"
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    store = RedisRunStore(redis7.client(), namespace=namespace)
    try:
        session = store.open_session("node-s", 60_000)
        for name in ("a", "b"):
            store.insert(name, b"r", session.lease)
        code, out = run(["inspect", "--url", url, "--namespace", namespace, "--json"],
                        monkeypatch)
        summary = json.loads(out)
        assert code == 0 and summary["held"] == 2
        [shown] = summary["sessions"]
        assert (shown["id"], shown["owner"], shown["runs"]) == (session.id, "node-s", 2)
        assert 0 < shown["ms_left"] <= 60_000
        code, out = run(["inspect", "--url", url, "--namespace", namespace, "--json", "a"],
                        monkeypatch)
        assert json.loads(out)["session"] == session.id
    finally:
        drop_namespace(redis7.client(), namespace)
        store.close()


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
    assert f"OK     namespace '{namespace}' over 4 partitions: the store runs; run layout 5" \
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

    # A shell starts a background job with SIGINT ignored, and a child inherits that, so
    # a suite run as `pytest ... &` would see a Ctrl-C ignored: the child takes it as a
    # terminal's process does.
    main = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
            "signal.default_int_handler); sys.argv[0] = 'redisstore'; "
            "runpy.run_module('redisstore', run_name='__main__')")
    done = subprocess.Popen([sys.executable, "-c", main, *argv], text=True,
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


@pytest.mark.server
def test_doctor_names_a_database_the_server_does_not_have(monkeypatch: pytest.MonkeyPatch,
                                                          redis7: Server) -> None:
    """SELECT 99 fails on a server of 16 databases, and then every command does: doctor
    says so, not that INFO and TIME are denied (no advice about ACLs)."""
    import json

    databases = int(redis7.client().config_get("databases")["databases"])
    url = f"redis://127.0.0.1:{redis7.port}/99"
    code, out = run(["doctor", "--url", url], monkeypatch)
    assert code == 1, out
    assert f"database 99 does not exist on this server (it has {databases})" in out, out
    assert "acl_rule" not in out and "+time" not in out and "+info" not in out, out
    code, out = run(["doctor", "--url", url, "--json"], monkeypatch)
    findings = json.loads(out)
    assert code == 1 and [f["severity"] for f in findings] == ["block"], findings
    assert f"below {databases}" in findings[0]["fix"], findings


def _first_line_then_close(argv: list[str]) -> tuple[bytes, int, bytes]:
    """``redisstore argv | head -1``: run it in a process of its own, unbuffered (as
    PYTHONUNBUFFERED=1 runs it; buffered, it fails only at exit), read its first line and
    close the pipe; that line, its exit code and what it wrote to stderr."""
    import os
    import subprocess
    import sys
    import threading

    env = {k: v for k, v in os.environ.items() if k != "REDISSTORE_URL"}
    done = subprocess.Popen([sys.executable, "-m", "redisstore", *argv], env={
        **env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert done.stdout is not None and done.stderr is not None
    timer = threading.Timer(60, done.kill)
    timer.start()
    try:
        first = done.stdout.readline()
        done.stdout.close()
        err = done.stderr.read()
        return first, done.wait(), err
    finally:
        timer.cancel()


def test_a_reader_that_goes_away_ends_the_demo_quietly() -> None:
    first, code, err = _first_line_then_close(["demo"])
    assert first.startswith(b"store: fakeredis (embedded)"), first
    assert err == b"", err.decode(errors="replace")
    assert code == cli.BROKEN_PIPE == 141


@pytest.mark.server
def test_a_reader_that_goes_away_still_leaves_nothing_on_a_server(redis7: Server) -> None:
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    first, code, err = _first_line_then_close(
        ["demo", "--url", f"redis://127.0.0.1:{redis7.port}/0", "--namespace", namespace])
    assert first.startswith(b"store: redis://127.0.0.1"), first
    assert err == b"" and code == 141, err.decode(errors="replace")
    assert list(redis7.client().scan_iter(match=f"{{{namespace}}}:*")) == []


#: Namespaces no command takes: braces break the hash tag ``{namespace}``, and ``#`` names a
#: partition's (``{ns#0}`` is partition 0 of ``ns``: ``drop`` of ``ns#0`` deleted it).
BAD_NAMESPACES = ["a{b}", "a}b", "{a}", "a#b", "a#0", ""]
COMMANDS = {"demo": [], "inspect": [], "doctor": [], "bench": ["--ops", "1"], "drop": ["--yes"]}


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
def test_every_command_refuses_a_bad_namespace_with_one_message(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        namespace: str) -> None:
    """Every command refuses it the same way, before it reaches a server (the URL names a
    closed port: a command that tried would print a failure line instead): its own usage,
    exit 2, and one message for every command, naming the namespace and the rule."""
    monkeypatch.setenv("REDISSTORE_URL", "redis://127.0.0.1:1/0")
    said: dict[str, str] = {}
    for command, more in COMMANDS.items():
        with pytest.raises(SystemExit) as exited:
            cli.main([command, "--namespace", namespace, *more])
        captured = capsys.readouterr()
        assert exited.value.code == 2 and captured.out == "", (command, captured)
        assert f"usage: redisstore {command}" in captured.err, (command, captured.err)
        said[command] = captured.err.strip().splitlines()[-1].replace(
            f"redisstore {command}: ", "")
    message = said["demo"]
    assert set(said.values()) == {message}, said
    assert repr(namespace) in message and "braces" in message and "'#'" in message, message
    assert "empty" in message, message


@pytest.mark.parametrize("namespace", ["a#0", "a{b}", "a}b"])
def test_drop_namespace_refuses_a_name_no_namespace_has(namespace: str) -> None:
    """``drop_namespace(client, "orders#0")`` deleted partition 0 of namespace "orders"."""
    import fakeredis

    from redisstore import RedisRunStore, Release, drop_namespace

    client = fakeredis.FakeRedis()
    store = RedisRunStore(client, namespace="a", partitions=2)
    for i in range(8):
        store.insert(f"r{i}", b"x", Release())
    before = sorted(client.scan_iter())
    assert any(key.startswith(b"{a#0}:") for key in before)
    with pytest.raises(ValueError, match="braces or '#'"):
        drop_namespace(client, namespace)
    assert sorted(client.scan_iter()) == before
    store.close()


@pytest.mark.server
def test_doctor_blocks_on_an_older_layout_and_inspect_names_it(
        monkeypatch: pytest.MonkeyPatch, redis7: Server) -> None:
    """A namespace an earlier version wrote (layout 4 here) is refused by every call until
    migrate(): doctor says so with the steps, inspect reports the layout; after
    migrate() both see layout 5."""
    import json

    import old_layouts

    from redisstore import RedisRunStore

    url = f"redis://127.0.0.1:{redis7.port}/0"
    namespace = f"cli-{uuid.uuid4().hex[:8]}"
    old_layouts.write(redis7.client(), namespace, 4,
                      {"r1": old_layouts.OldRun(record=b"x", own="me", exp=2**42)})
    code, out = run(["doctor", "--url", url, "--namespace", namespace], monkeypatch)
    assert code == 1 and f"BLOCK  namespace '{namespace}' is at run layout 4" in out
    assert "store.migrate()" in out
    code, out = run(["inspect", "--url", url, "--namespace", namespace, "--json"],
                    monkeypatch)
    assert code == 0 and json.loads(out)["layout"] == 4
    RedisRunStore(redis7.client(), namespace=namespace).migrate()
    code, out = run(["doctor", "--url", url, "--namespace", namespace], monkeypatch)
    assert code == 0 and "the store runs; run layout 5" in out
    code, out = run(["inspect", "--url", url, "--namespace", namespace, "--json"],
                    monkeypatch)
    assert json.loads(out)["layout"] == 5 and json.loads(out)["held"] == 1
    run(["drop", "--url", url, "--namespace", namespace, "--yes"], monkeypatch)
