"""The house's plan, measured: every module's floor, no circle, the core on the ground.

A module's floor is one more than the highest floor of the package's modules it imports (a
module importing nothing of the package is floor 1). Every import counts: at the top, in a
function, or for the type checker alone (``if TYPE_CHECKING:``). ``from P import n`` counts
the module ``P.n`` when there is one, else ``P`` itself. docs/design/house.md lists the
floors these tests compute.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "redisstore"

#: The highest floor a module may stand on: the goal, reached (docs/design/house.md).
MAX_FLOOR = 7
#: The highest floor today: it may only come down (lower it as the chain shortens).
CEILING = 7  # from 16: caps, mixins, dashboard, command, stores, suites, feed, pipelines
#: The ports' values and errors, in the core: they import nothing but each other.
PORTS = frozenset({"redisstore.core.errors", "redisstore.core.caps", "redisstore.core.runs",
                   "redisstore.core.repository", "redisstore.core.feed"})
#: Where users always imported the ports from: each re-exports its module of the core.
OLD_HOMES = {f"redisstore.{name}": f"redisstore.core.{name}"
             for name in ("errors", "runs", "repository", "feed")}


def modules() -> dict[str, tuple[Path, bool]]:
    """Each module of the package by dotted name: its file, whether it is a package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        found[".".join(parts)] = (path, package)
    return found


@functools.cache
def imports() -> dict[str, frozenset[str]]:
    """The package's modules each module imports, wherever the import is written."""
    mods = modules()
    edges: dict[str, frozenset[str]] = {}
    for name, (path, package) in mods.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                if target.split(".")[0] != "redisstore":
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    out.add(sub if sub in mods else target)
        out.discard(name)
        edges[name] = frozenset(out & mods.keys())
    return edges


def circles() -> list[list[str]]:
    """Every circle of imports found by a depth-first walk (each as the modules on it)."""
    edges = imports()
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for other in sorted(edges[module]):
            if state.get(other) == 1:
                found.append([*stack[stack.index(other):], other])
            elif other not in state:
                walk(other)
        stack.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            walk(module)
    return found


def floors() -> dict[str, int]:
    """Each module's floor (the import graph has no circle: see the test)."""
    edges = imports()

    @functools.cache
    def floor(module: str) -> int:
        return 1 + max((floor(other) for other in edges[module]), default=0)

    return {module: floor(module) for module in edges}


def test_no_circle_of_imports():
    assert circles() == []


def test_no_module_stands_above_the_ceiling():
    assert not circles()
    assert max(floors().values()) <= CEILING


def test_no_module_stands_above_the_highest_floor():
    assert not circles()
    high = {m: f for m, f in floors().items() if f > MAX_FLOOR}
    assert high == {}, sorted(high.items(), key=lambda item: item[1])


def in_core(module: str) -> bool:
    return module == "redisstore.core" or module.startswith("redisstore.core.")


def test_the_core_imports_nothing_above_it():
    # The ground floor: nothing of the package root, the shells or the rooms.
    edges = imports()
    wrong = {m: sorted(o for o in edges[m] if not in_core(o)) for m in edges if in_core(m)}
    assert {m: o for m, o in wrong.items() if o} == {}


def test_the_ports_import_nothing_but_each_other():
    edges = imports()
    assert {m: sorted(edges[m] - PORTS) for m in PORTS if edges[m] - PORTS} == {}


def test_the_ports_old_homes_only_re_export_the_core():
    edges = imports()
    assert {m: edges[m] for m in OLD_HOMES} == {m: {c} for m, c in OLD_HOMES.items()}
    for old, new in OLD_HOMES.items():
        moved = importlib.import_module(new)
        public = {n for n in vars(moved) if not n.startswith("_")}
        assert public <= set(vars(importlib.import_module(old))), old


def test_the_floors_are_counted_as_the_house_says():
    # The rule on a known shape: a module of nothing is 1; its importer 2.
    assert floors()["redisstore.core.errors"] == 1
    assert floors()["redisstore.errors"] == 2



ROOT = PACKAGE.parent
HOUSE = ROOT / "docs" / "design" / "house.md"


def floor_rows() -> list[str]:
    """The floors table of docs/design/house.md, as the floors are."""
    rooms: dict[int, list[str]] = {}
    for module, floor in floors().items():
        short = module.removeprefix("redisstore").removeprefix(".") or "(root)"
        rooms.setdefault(floor, []).append(short)
    return [f"| {n} | {', '.join(f'`{m}`' for m in sorted(rooms[n]))} |" for n in sorted(rooms)]


def test_the_house_lists_the_floors_as_they_are():
    text = HOUSE.read_text(encoding="utf-8")
    section = text[text.index("## Floors"):text.index("## Who owns what")]
    listed = [line for line in section.splitlines() if re.match(r"\| \d+ \| `", line)]
    assert listed == floor_rows(), "docs/design/house.md's floors: " + "\n".join(floor_rows())
    assert f"The highest floor is {max(floors().values())}," in text


def test_every_path_the_house_names_exists():
    # The floors table names modules, not files (the recipes' numbered tables name files).
    whole = HOUSE.read_text(encoding="utf-8")
    floors_at = whole.index("## Floors"), whole.index("## Who owns what")
    section = whole[floors_at[0]:floors_at[1]]
    section = "\n".join(line for line in section.splitlines()
                        if not re.match(r"\| \d+ \| `", line))
    text = whole[:floors_at[0]] + section + whole[floors_at[1]:]
    names = {n for n in re.findall(r"`([^`\s]+)`", text)
             if ("/" in n or re.search(r"\.(py|lua|json|md|toml)$", n))
             and not re.search(r"[<*]", n) and not n.startswith("{")}
    assert len(names) > 40
    # ... and the paths written bare, outside backticks (lua/_lib/ops.lua, docs/faults.md, a
    # link's target): a name with a file's extension, or a folder with its slash. A word with
    # a slash alone (I/O, pub/sub) is prose.
    bare = re.sub(r"`[^`]*`", " ", text)
    written = {n.rstrip(".") for n in re.findall(
        r"(?<![\w/.<*{-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:py|lua|json|md|toml)"
        r"|(?:[\w.-]+/)+)(?![\w*<>])", bare)}
    assert "docs/faults.md" in written and len(written) > 8
    names |= written
    # A table names its files from its section's folder: the root, the package, a room,
    # lua/, docs/.
    places = [ROOT, PACKAGE, *(d for d in PACKAGE.iterdir() if d.is_dir()), ROOT / "lua",
              ROOT / "lua" / "_lib", ROOT / "docs", ROOT / "docs" / "design"]
    missing = sorted(n for n in names if not any((place / n).exists() for place in places))
    assert missing == []


def test_the_core_never_awaits():
    # The ground floor is sans-I/O: what awaits lives in the shells (docs/design/house.md).
    found = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []


def test_every_module_and_test_file_the_docs_name_exists():
    # What a reader runs (``python -m redisstore.x``) and the tests a design points to.
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    wrong = []
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        for name in re.findall(r"python -m (redisstore(?:\.\w+)*)", text):
            if importlib.util.find_spec(name) is None:
                wrong.append(f"{doc.relative_to(ROOT)}: {name}")
        for name in re.findall(r"(?<![\w/.])(tests/[\w/]+\.py)", text):
            if not (ROOT / name).exists():
                wrong.append(f"{doc.relative_to(ROOT)}: {name}")
    assert wrong == []


def test_the_house_names_every_file_at_the_top_of_the_tests():
    # tests/ mirrors the package: what stays at the top is named, with why, in the map.
    text = HOUSE.read_text(encoding="utf-8")
    section = text[text.index("**Tests, benchmarks, docs.**"):text.index("## One call")]
    top = {p.name for p in (ROOT / "tests").glob("*.py")} - {"conftest.py"}
    assert sorted(n for n in top if f"`tests/{n}`" not in section) == []
