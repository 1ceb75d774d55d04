"""Write the stores' methods that follow from the core: the run store's and the repository's.

Each public operation of the run store is written once, in :class:`redisstore.core.runops.RunOps`:
its signature and docstring, its checks, its script call and its reply's parse, with an
:func:`~redisstore.core.runops.operation` beside it that says what kind it is and how a store of
partitions routes it. From that one definition this module writes, as mixin classes with
real signatures, overloads and docstrings (for mypy --strict and an IDE alike):

==============================  ================  ======================================
file                            class             inherited by
==============================  ================  ======================================
redisstore/shells/store_ops.py        ``StoreOps``      :class:`redisstore.RedisRunStore`
redisstore/shells/aio_ops.py          ``AsyncStoreOps`` :class:`redisstore.AsyncRedisRunStore`
redisstore/core/pipeline_ops.py     ``PipelineOps``   ``core.pipeline.Pipelined``
redisstore/core/partition_ops.py    ``PartitionOps``  ``core.partitions.PartitionedOps``
==============================  ================  ======================================

A session's claims follow from the claim operations too: ``redisstore/session_ops.py``
(``SessionMethods``, ``AsyncSessionMethods``, inherited by :class:`redisstore.Session` and
:class:`redisstore.AsyncSession`) has one of each, with the operation's overloads, and the
sessions' other calls, written once here for both.

The repository's methods both stores offer are written once too, in
:class:`redisstore.core.repository_ops.RepositoryOps` (marked ``@public``): this module
writes them for :class:`redisstore.RedisRepository` (``shells/repo_store_ops.py``,
``RepositoryStoreOps``) and :class:`redisstore.AsyncRedisRepository`
(``shells/repo_aio_ops.py``, ``AsyncRepositoryStoreOps``), each handing the core's
operation to the store's ``_send`` (their ``migrate()`` and ``cluster_compatibility()``
too). The run stores' ``migrate()``, a loop of the core's steps, is written here once
(``Stores.also``) for both. No sync/async twin of these is
written by hand: what differs between the two stores is only their primitives.

Each method only hands the core's operation to a primitive of its class (``_read``,
``_write``, ``_claim``; ``_queue``; ``_one``, ``_each``, ``_claims``), which the class
inheriting the mixin writes by hand, once for every operation. The partitions' mixin is
typed by ``PartCalls``, a ``Protocol`` of one partition's operations written beside it from
the same definitions, not by ``RunOps`` itself: so it, and ``core/partitions.py`` on it,
stand one floor lower (docs/design/house.md). The memory reference
(:mod:`redisstore.memory`) and the port (:class:`redisstore.runs.RunStore`) stay written
by hand: the tests check the stores against them.

Run ``python -m redisstore.build.ops`` after changing an operation (it rewrites the files);
``--check`` only tells whether they are current (tests/codegen/test_generated.py does the same).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core import repository_ops
from ..core.runops import RunOps, Spec

PACKAGE = Path(__file__).resolve().parents[1]
WIDTH = 100

#: Where each name an annotation may use comes from (a name neither here nor a builtin stops
#: the generator: add it here).
IMPORTS = {
    "Any": "typing",
    "Literal": "typing",
    "Callable": "collections.abc",
    "Generator": "collections.abc",
    "Self": "typing",
    "Iterable": "collections.abc",
    "Sequence": "collections.abc",
    "Keyspace": "redisstore.core.keys",
    "Feed": "redisstore.core.feed",
    "Operation": "redisstore.core.driver",
    "Spread": "redisstore.core.driver",
    "Sendable": "redisstore.core.driver",
    "Claimed": "redisstore.core.runs",
    "Current": "redisstore.core.runs",
    "Failure": "redisstore.core.runs",
    "Fenced": "redisstore.core.runs",
    "Lease": "redisstore.core.runs",
    "Quarantined": "redisstore.core.runs",
    "Kept": "redisstore.core.runs",
    "SessionInfo": "redisstore.core.runs",
    "Changes": "redisstore.core.feed",
    "Rate": "redisstore.core.feed",
    "RunOps": "redisstore.core.runops",
    "Share": "redisstore.core.waits",
    "PartitionOps": "redisstore.core.partition_ops",
    "PartCalls": "redisstore.core.partition_ops",
    "PipelineCalls": "redisstore.core.pipeline_ops",
    "Pending": "redisstore.core.driver",
    "datetime": "datetime",
    "InstanceRecord": "redisstore.core.repository",
    "InFlightPage": "redisstore.core.repository",
    "RepositoryCalls": "redisstore.shells.repo_store_ops",
}
BUILTINS = {"str", "int", "bytes", "bool", "float", "None", "list", "tuple", "dict", "set", "T",
            "object"}
#: What a generated file imports at run time from the package (a value, not a type alone).
RUNTIME = {"Migrated": "redisstore.core.runs", "MIGRATE_COUNT": "redisstore.core.runs"}
#: What the generated modules always import at run time.
ALWAYS = {"typing": {"TYPE_CHECKING", "TypeVar", "overload"}}


@dataclass(frozen=True)
class Signature:
    """One signature of an operation: its parameters (without ``self``) and what its
    operation answers (``X`` of ``Operation[X]``)."""

    params: tuple[inspect.Parameter, ...]
    answers: str


@dataclass(frozen=True)
class Op:
    """A public operation of the run store, as :class:`RunOps` defines it."""

    name: str
    spec: Spec
    signature: Signature
    overloads: tuple[Signature, ...]
    doc: str

    @property
    def kind(self) -> str:
        return self.spec.kind

    def args(self, **renamed: str) -> str:
        """The call of the core with this operation's own arguments (``renamed``: another
        expression for some)."""
        return ", ".join(self.arg_list(**renamed))

    def arg_list(self, **renamed: str) -> list[str]:
        """:meth:`args`, one item an argument."""
        return call_args(self.signature.params, renamed)


def _answers(returns: str) -> str:
    """``X`` of an ``Operation[X]`` annotation."""
    node = ast.parse(returns, mode="eval").body
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and node.value.id == "Operation"):
        raise ValueError(f"an operation answers Operation[...], not {returns}")
    return ast.unparse(node.slice)


def runs_of(answers: str) -> str:
    """What a claim hands back: ``A`` of its operation's ``tuple[A, int]`` (runs, wait)."""
    node = ast.parse(answers, mode="eval").body
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple)):
        raise ValueError(f"a claim answers tuple[runs, int], not {answers}")
    return ast.unparse(node.slice.elts[0])


def _signature(function: Callable[..., object]) -> Signature:
    sig = inspect.signature(function)
    params = tuple(sig.parameters.values())[1:]
    for param in params:
        if not isinstance(param.annotation, str):
            raise ValueError(f"{function.__qualname__}: every parameter is annotated")
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ValueError(f"{function.__qualname__}: no *args, **kwargs or positional-only")
    return Signature(params, _answers(str(sig.return_annotation)))


def operations() -> list[Op]:
    """The public operations of :class:`RunOps`, in the order it defines them."""
    found = []
    for name, function in vars(RunOps).items():
        spec = getattr(function, "__operation__", None)
        if not isinstance(spec, Spec):
            continue
        doc = inspect.getdoc(function)
        if not doc:
            raise ValueError(f"RunOps.{name} has no docstring: the stores' would be empty")
        found.append(Op(name, spec, _signature(function),
                        tuple(_signature(o) for o in typing.get_overloads(function)), doc))
    return found


def repository_operations() -> list[Op]:
    """The repository's methods both stores offer (:data:`repository_ops.PUBLIC`), each
    :class:`~redisstore.core.repository_ops.RepositoryOps`'s of its name, in that order."""
    found = []
    for name in repository_ops.PUBLIC:
        function = getattr(repository_ops.RepositoryOps, name)
        doc = inspect.getdoc(function)
        if not doc:
            raise ValueError(f"RepositoryOps.{name} has no docstring: the stores' would be "
                             "empty")
        found.append(Op(name, Spec("write", "own"), _signature(function), (), doc))
    return found


# ---------------------------------------------------------------------- rendering


def param_text(param: inspect.Parameter) -> str:
    text = f"{param.name}: {param.annotation}"
    if param.default is not param.empty:
        text += f" = {param.default!r}"
    return text


def params_text(params: tuple[inspect.Parameter, ...]) -> list[str]:
    """``self``, the parameters, a ``*`` before the first keyword-only one."""
    items = ["self"]
    for param in params:
        if param.kind is param.KEYWORD_ONLY and "*" not in items:
            items.append("*")
        items.append(param_text(param))
    return items


def call_args(params: tuple[inspect.Parameter, ...], renamed: dict[str, str]) -> list[str]:
    return [renamed.get(p.name, p.name) if p.kind is p.POSITIONAL_OR_KEYWORD
            else f"{p.name}={renamed.get(p.name, p.name)}" for p in params]


def wrap(indent: int, head: str, items: list[str], tail: str, *, orphan: bool = False
         ) -> list[str]:
    """``head`` (ending in an opening bracket), ``items`` separated by commas, ``tail`` (from
    the closing bracket on), within WIDTH: on one line; else continued under the bracket
    (when it is not far right; ``orphan``: the tail may go on a line of its own, as a
    signature's return type does); else on hanging lines."""
    pad = " " * indent
    one = pad + head + ", ".join(items) + tail
    if len(one) <= WIDTH:
        return [one]
    tries: list[list[str] | None] = []
    if orphan or len(pad + head) <= WIDTH // 2:
        tries.append(_fill(pad + head, " " * (indent + len(head)), items, tail, orphan))
    hanging = _fill(None, pad + "    ", items, tail, False)
    tries.append(None if hanging is None else [pad + head.rstrip(), *hanging])
    for lines in tries:
        if lines is not None and all(len(line) <= WIDTH for line in lines):
            return lines
    raise ValueError(f"cannot fit within {WIDTH} columns: {one.strip()}")


def _fill(start: str | None, under: str, items: list[str], tail: str,
          orphan: bool) -> list[str] | None:
    lines: list[str] = []
    line = start if start is not None else under
    fresh = True
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        gap = "" if fresh else " "
        if not fresh and len(line + gap + piece) > WIDTH:
            lines.append(line)
            line, gap = under, ""
        line += gap + piece
        fresh = False
    if len(line + tail) > WIDTH:
        if not orphan:
            return None
        lines.append(line)
        line = under + tail.lstrip()
    else:
        line += tail
    lines.append(line)
    return lines


def docstring(indent: int, text: str) -> list[str]:
    """``text`` as a docstring at ``indent`` (a line too long for WIDTH filled again)."""
    pad = " " * indent
    lines = []
    for line in text.splitlines():
        if len(pad + line) + 6 <= WIDTH:
            lines.append(line)
        else:
            lines.extend(textwrap.wrap(line, WIDTH - indent - 3))
    if len(lines) == 1:
        return [f'{pad}"""{text}"""']
    body = [pad + line if line else "" for line in lines[1:]]
    if "\n\n" in text:  # paragraphs: the closing quotes on a line of their own
        return [f'{pad}"""{lines[0]}', *body, f'{pad}"""']
    body[-1] += '"""'
    return [f'{pad}"""{lines[0]}', *body]


@dataclass(frozen=True)
class Method:
    """What a target makes of one signature of an operation."""

    params: list[str]
    returns: str


class Target:
    """A generated mixin: its file, class, docstring, primitives and methods."""

    path = ""
    cls = ""
    about = ""
    #: Declarations the mixin starts with: what its methods call (the inheriting class's).
    primitives = ""
    asynchronous = False
    #: Where its operations are written (the generated file's first lines say so).
    origin = "redisstore/core/runops.py"

    def operations(self) -> list[Op]:
        """The operations it writes a method for: the run store's."""
        return operations()

    def wants(self, op: Op) -> bool:
        return True

    def overloads(self, op: Op) -> tuple[Signature, ...]:
        """The overloads to write: the core's but one the same as the implementation (for
        the core's callers that pass a bool; the port has none)."""
        return tuple(o for o in op.overloads if o != op.signature)

    def method(self, op: Op, sig: Signature) -> Method:
        raise NotImplementedError

    def body(self, op: Op) -> list[str]:
        """The implementation's statements, at 8 columns."""
        raise NotImplementedError

    def doc(self, op: Op) -> str:
        return op.doc

    #: Methods written here once for the sync and the asyncio class alike: ``{async_}``
    #: before ``def``, ``{await_}`` before a primitive's call.
    also = ""

    def render(self, ops: list[Op]) -> str:
        out: list[str] = []
        for op in ops:
            if not self.wants(op):
                continue
            out.append("")
            for sig in self.overloads(op):
                out.append("    @overload")
                out.extend(self._def(op, sig, " ..."))
                out.append("")
            out.extend(self._def(op, op.signature, ""))
            out.extend(docstring(8, self.doc(op)))
            out.extend(self.body(op))
        if self.also:
            asynchronous = self.asynchronous
            out.extend(["", *self.also.strip("\n").format(
                async_="async " if asynchronous else "",
                await_="await " if asynchronous else "",
                a="a" if asynchronous else "").splitlines()])
        head = f"class {self.cls}:"
        return "\n".join([head, *docstring(4, self.about), "",
                          *self.primitives.strip("\n").splitlines(), *out]) + "\n"

    def _def(self, op: Op, sig: Signature, suffix: str) -> list[str]:
        made = self.method(op, sig)
        keyword = "async def" if self.asynchronous else "def"
        return wrap(4, f"{keyword} {op.name}(", made.params, f") -> {made.returns}:{suffix}",
                    orphan=True)


def _index(op: Op) -> str:
    return op.spec.route.partition(":")[2]


BLOCK = "block: int | None = None"


class Stores(Target):
    """:class:`redisstore.RedisRunStore`'s operations (or the asyncio twin's)."""

    path = "shells/store_ops.py"
    cls = "StoreOps"
    about = ("The run store's operations of :class:`redisstore.RedisRunStore`, each the\n"
             "core's (:class:`redisstore.core.runops.RunOps`) handed to the store's ``_read``,\n"
             "``_write`` or ``_claim``.")
    primitives = '''
    _ops: RunOps | PartitionOps

    def _read(self, op: Operation[T] | Spread[T]) -> T:
        """Send a read; its answer."""
        raise NotImplementedError

    def _write(self, op: Operation[T] | Spread[T]) -> T:
        """Send a write (the server check first, once); its answer."""
        raise NotImplementedError

    def _claim(self, index: str, limit: int, block: int | None,
               claim: Callable[[], Operation[tuple[list[Any], int]]
                               | Spread[tuple[list[Any], int]]]) -> list[Any]:
        """Send the claim ``claim()`` makes (again, while ``block`` says to wait for
        ``index``); its runs."""
        raise NotImplementedError
'''
    also = '''
    {async_}def migrate(self, *, count: int = MIGRATE_COUNT) -> Migrated:
        """Move a namespace an earlier version wrote (run layouts 1 to 4) to layout 5, the
        only one this version reads, in bounded steps: an offline step.

        Until it is done every other operation on such a namespace raises
        ``Misconfigured`` and writes nothing: stop every node of the namespace, call this
        once (from one process, or several: the steps share the work), then start the
        nodes with this version. A new namespace starts at layout 5, and on one (or on a
        namespace already moved) this is one step that scans nothing. Each step is one
        script that visits one SCAN page of at most ``count`` keys of the server (at most
        200), rewrites at most 512 KiB of records (at least one run) and moves at most
        1,024 entries of layout 4's bucketed indexes; steps go on until a whole pass over
        the server's keys moves nothing. Safe to stop and resume (the cursor is kept in
        the namespace). Damaged runs are left as they are and listed by
        :meth:`quarantined` under the index ``"migrate"``. docs/runs.md, "Layouts and
        ``migrate()``", has the rules.
        """
        report = Migrated()
        while True:
            step = {await_}self._write(self._ops.migrate_step(count))
            report = report.then(step)
            if step[1]:
                return report
'''
    awaits = ""

    def method(self, op: Op, sig: Signature) -> Method:
        params = params_text(sig.params)
        if op.kind == "claim":
            return Method([*params, BLOCK] if "*" in params else [*params, "*", BLOCK],
                          runs_of(sig.answers))
        return Method(params, sig.answers)

    def body(self, op: Op) -> list[str]:
        ret = "return " if op.signature.answers != "None" else ""
        core = f"self._ops.{op.name}({op.args()})"
        if op.kind == "claim":
            return wrap(8, f'return {self.awaits}self._claim("{_index(op)}", limit, block, '
                        f"lambda: self._ops.{op.name}(", op.arg_list(), "))")
        primitive = "_read" if op.kind == "read" else "_write"
        return wrap(8, f"{ret}{self.awaits}self.{primitive}(", [core], ")")


class AsyncStores(Stores):
    """:class:`redisstore.AsyncRedisRunStore`'s operations."""

    path = "shells/aio_ops.py"
    cls = "AsyncStoreOps"
    about = ("The run store's operations of :class:`redisstore.AsyncRedisRunStore`, each the\n"
             "core's (:class:`redisstore.core.runops.RunOps`) handed to the store's ``_read``,\n"
             "``_write`` or ``_claim``.")
    primitives = '''
    _ops: RunOps | PartitionOps

    async def _read(self, op: Operation[T] | Spread[T]) -> T:
        """Send a read; its answer."""
        raise NotImplementedError

    async def _write(self, op: Operation[T] | Spread[T]) -> T:
        """Send a write (the server check first, once); its answer."""
        raise NotImplementedError

    async def _claim(self, index: str, limit: int, block: int | None,
                     claim: Callable[[], Operation[tuple[list[Any], int]]
                                     | Spread[tuple[list[Any], int]]]) -> list[Any]:
        """Send the claim ``claim()`` makes (again, while ``block`` says to wait for
        ``index``, without blocking the event loop); its runs."""
        raise NotImplementedError
'''
    asynchronous = True
    awaits = "await "

    def doc(self, op: Op) -> str:
        if op.kind == "claim":
            return op.doc + "\n\nA blocked call waits without blocking the event loop."
        return op.doc


class Pipelines(Target):
    """The calls a pipeline queues (:class:`redisstore.core.pipeline.Pipelined`)."""

    path = "core/pipeline_ops.py"
    cls = "PipelineOps"
    about = ("The calls a pipeline queues (:class:`redisstore.core.pipeline.Pipelined`, sync and\n"
             "asyncio alike), each the core's operation (:class:`redisstore.core.runops.RunOps`)\n"
             "handed to ``_queue``: its arguments are checked at once.")
    primitives = '''
    _ops: PipelineCalls

    def _queue(self, op: Operation[T] | Spread[T], *, write: bool = True) -> Pending[T]:
        """Queue ``op``."""
        raise NotImplementedError

    def _queue_claim(self, index: str, limit: int, block: int | None,
                     claim: Callable[[], Operation[tuple[list[Any], int]]
                                     | Spread[tuple[list[Any], int]]]) -> Pending[Any]:
        """Queue the claim ``claim()`` makes: its runs, without its wait. With ``block``,
        a claim that got nothing waits for ``index`` after the round trip, as the store's
        does."""
        raise NotImplementedError
'''

    def wants(self, op: Op) -> bool:
        return op.spec.pipeline

    def render(self, ops: list[Op]) -> str:
        # What the mixin calls on a store's operations, one partition's or many's: a
        # Protocol of its own, so the mixin stands below both (PartCalls and PartitionOps
        # stand where the partitions' values do).
        calls = ["class PipelineCalls(Protocol):",
                 *docstring(4, "The operations a pipeline queues, as a store's operations "
                               "make them: one\npartition's (:class:`redisstore.core.runops."
                               "RunOps`) or many's (``PartitionOps``).")]
        for op in ops:
            if not self.wants(op):
                continue
            for sig in op.overloads or (op.signature,):
                calls.append("")
                if op.overloads:
                    calls.append("    @overload")
                calls.extend(wrap(4, f"def {op.name}(", params_text(sig.params),
                                  f") -> Sendable[{sig.answers}]: ...", orphan=True))
        return "\n".join(calls) + "\n\n\n" + super().render(ops)

    def method(self, op: Op, sig: Signature) -> Method:
        params = params_text(sig.params)
        if op.kind != "claim":
            return Method(params, f"Pending[{sig.answers}]")
        answers = "Any" if sig is op.signature else runs_of(sig.answers)
        return Method([*params, BLOCK] if "*" in params else [*params, "*", BLOCK],
                      f"Pending[{answers}]")

    def doc(self, op: Op) -> str:
        note = f" ({op.spec.queued})" if op.spec.queued else ""
        if op.kind == "claim":
            note = (": with ``block``, a claim that got nothing in the pipeline's round trip"
                    "\n        waits for work after it, as the store's does")
        return f"Queue :meth:`redisstore.RedisRunStore.{op.name}`{note}."

    def body(self, op: Op) -> list[str]:
        if op.kind == "claim":
            return wrap(8, f'return self._queue_claim("{_index(op)}", limit, block, '
                        f"lambda: self._ops.{op.name}(", op.arg_list(), "))")
        read = ", write=False" if op.kind == "read" else ""
        return wrap(8, f"return self._queue(self._ops.{op.name}(", op.arg_list(), f"){read})")


class Partitions(Target):
    """The store of partitions' operations (:class:`redisstore.core.partitions.PartitionedOps`)."""

    path = "core/partition_ops.py"
    cls = "PartitionOps"
    about = ("The run store's operations over partitions\n"
             "(:class:`redisstore.core.partitions.PartitionedOps`): each the core's operation\n"
             "(:class:`redisstore.core.runops.RunOps`) in the partitions its route names.")
    primitives = '''
    parts: Sequence[PartCalls]
    #: What the shells and the pipelines ask of a store of partitions beside its operations
    #: (PartitionedOps has them): they type it by this class, below core/partitions.py.
    keys: Keyspace
    checks: set[str]

    def place(self, run: str) -> int:
        """The partition of ``run``."""
        raise NotImplementedError

    def set_feed(self, feed: Feed | None) -> None:
        """Open the store with ``feed`` (every partition's)."""
        raise NotImplementedError

    def checked(self) -> bool:
        """Whether a pipeline needs no check first."""
        raise NotImplementedError

    def server_check(self) -> Operation[None]:
        """What a pipeline of writes sends first."""
        raise NotImplementedError

    def read_check(self) -> Operation[None] | None:
        """What a pipeline of reads only sends first."""
        raise NotImplementedError

    def counting(self, op: Operation[T] | Spread[T]) -> Operation[T] | Spread[T]:
        """``op`` as a store sends a read (the sync store's primitives ask it)."""
        raise NotImplementedError

    def guarded(self, op: Operation[T] | Spread[T]) -> Operation[T] | Spread[T]:
        """``op`` as a store sends a write."""
        raise NotImplementedError

    def _one(self, run: str, make: Callable[[PartCalls], Operation[T]], *,
             write: bool) -> Operation[T]:
        """A call of one run in its partition."""
        raise NotImplementedError

    def _each(self, runs: Iterable[str],
              call: Callable[[PartCalls, list[str]], Operation[T]]) -> Spread[T]:
        """A call over many runs: one in each partition, with its runs."""
        raise NotImplementedError

    def _claims(self, index: str, checks: Operation[tuple[list[Any], int]], limit: int,
                records: bool,
                claim: Callable[[PartCalls, Share], Operation[tuple[list[Any], int]]]
                ) -> Spread[tuple[list[Any], int]]:
        """A claim over every partition's ``index`` (``checks``: the core's, for its
        arguments' checks), each share by ``claim``."""
        raise NotImplementedError

    def migrate_step(self, count: int) -> Spread[tuple[int, bool, int, int]]:
        """One step of ``migrate()`` in every partition at once (the stores' loop)."""
        raise NotImplementedError

    # A session's steps (redisstore/shells/sessions.py sends them), each fanned to the
    # partitions where the session is kept.
    def session_open(self, owner: str, ttl: int) -> Spread[str]:
        """Open a session in every partition at once, under partition 0's id."""
        raise NotImplementedError

    def session_keepalive(self, session: str, owner: str) -> Spread[Kept]:
        """Keep ``session`` alive in every partition where it lives."""
        raise NotImplementedError

    def session_claim(self, kind: str, session: str, owner: str, ttl: int, limit: int,
                      records: bool, max_takeovers: int | None
                      ) -> Spread[tuple[list[Any], int]]:
        """A claim under ``session`` over the partitions where it lives."""
        raise NotImplementedError

    def session_close(self, session: str, owner: str, count: int
                      ) -> Spread[tuple[int, bool]]:
        """One step of ``close`` in every partition at once."""
        raise NotImplementedError

    def sessions(self, limit: int) -> Spread[list[SessionInfo]]:
        """The sessions of every partition, each once."""
        raise NotImplementedError
'''

    def render(self, ops: list[Op]) -> str:
        # What the mixin calls on a partition: the core's operations as RunOps defines them
        # (a Protocol, so the mixin stands below RunOps, as RepositoryCalls does below the
        # repositories' operations).
        calls = ["class PartCalls(Protocol):",
                 *docstring(4, "One partition's operations, as :class:`redisstore.core.runops."
                               "RunOps`\ndefines them: what :class:`PartitionOps` calls on "
                               "each of its ``parts``, and a pipeline on a store's "
                               "operations.")]
        for op in ops:
            kind, _, _ = op.spec.route.partition(":")
            sigs = [(op.name, sig, True) for sig in op.overloads] or [(op.name, op.signature,
                                                                        False)]
            if kind == "claim":
                sigs.append((f"{op.name}_call",
                             _signature(getattr(RunOps, f"{op.name}_call")), False))
            for name, sig, overloaded in sigs:
                calls.append("")
                if overloaded:
                    calls.append("    @overload")
                calls.extend(wrap(4, f"def {name}(", params_text(sig.params),
                                  f") -> Operation[{sig.answers}]: ...", orphan=True))
        return "\n".join(calls) + "\n\n\n" + super().render(ops)

    def overloads(self, op: Op) -> tuple[Signature, ...]:
        """Every overload of the core: the shells call these with a bool."""
        return op.overloads

    def method(self, op: Op, sig: Signature) -> Method:
        kind, _, _ = op.spec.route.partition(":")
        if kind not in ("each", "claim", "own"):
            return Method(params_text(sig.params), f"Operation[{sig.answers}]")
        # A Spread is invariant: an overloaded one's implementation answers Spread[Any].
        spread = "Any" if op.overloads and sig is op.signature else sig.answers
        return Method(params_text(sig.params), f"Spread[{spread}]")

    def doc(self, op: Op) -> str:
        kind, _, arg = op.spec.route.partition(":")
        how = {"first": "partition 0's (each partition's leases are judged by its own "
                        "server's clock)",
               "one": f"in the partition of ``{arg}``",
               "each": f"the runs of ``{arg}`` by partition, one call in each, the answer in "
                       "the caller's order",
               "claim": ("a claim over every partition's "
                         + ("two indexes" if arg == "any" else f"``{arg}`` index")
                         + " (:meth:`_claim`)")}
        if kind == "own":
            return (f"See :meth:`RunOps.{op.name}`: written by ``PartitionedOps`` itself; "
                    "declared here so the mixins above type a store's operations by this "
                    "class alone.")
        return f"See :meth:`RunOps.{op.name}`: {how[kind]}."

    def body(self, op: Op) -> list[str]:
        kind, _, arg = op.spec.route.partition(":")
        name = op.name
        if kind == "own":
            return ["        raise NotImplementedError"]
        if kind == "first":
            return [f"        return self.parts[0].{name}({op.args()})"]
        if kind == "one":
            return wrap(8, f"return self._one({arg}, lambda part: part.{name}(", op.arg_list(),
                        f"), write={op.kind != 'read'})")
        if kind == "each":
            return wrap(8, f"return self._each({arg}, lambda part, group: part.{name}(",
                        op.arg_list(**{arg: "group"}), "))")
        if kind == "claim":
            # The core's own call makes its checks; each partition's share goes to
            # <claim>_call(share, the claim's arguments but limit and records).
            share = [p.name for p in op.signature.params if p.name not in ("limit", "records")]
            return [*wrap(8, f"checks = self.parts[0].{name}(", op.arg_list(), ")"),
                    *wrap(8, "return self._claims(", [
                        f'"{arg}"', "checks", "limit", "records",
                        f"lambda part, share: part.{name}_call({', '.join(['share', *share])})"],
                        ")")]
        raise ValueError(f"RunOps.{name}: unknown route {op.spec.route!r}")


class Repositories(Target):
    """:class:`redisstore.RedisRepository`'s methods (or the asyncio twin's)."""

    path = "shells/repo_store_ops.py"
    cls = "RepositoryStoreOps"
    about = ("The repository's methods of :class:`redisstore.RedisRepository`, each the\n"
             "core's (:class:`redisstore.core.repository_ops.RepositoryOps`) handed to the\n"
             "store's ``_send``.")
    origin = "redisstore/core/repository_ops.py"
    primitives = '''
    _ops: RepositoryCalls

    def _send(self, op: Operation[T] | Spread[T]) -> T:
        """Send ``op``; its answer."""
        raise NotImplementedError

    def _settings(self) -> bool:
        """Whether ``migrate()`` checks the server's settings (fakeredis has none)."""
        raise NotImplementedError
'''
    also = '''
    {async_}def migrate(self) -> None:
        """Prepare the server, idempotently: load the scripts, record the layout version,
        and check the settings. Raises ``Misconfigured`` when the server may evict keys
        (``maxmemory-policy allkeys-*``); warns when nothing is persisted, or when
        ``CONFIG GET`` is not allowed (managed services), and goes on."""
        {await_}self._send(self._ops.migrate(settings=self._settings()))

    {async_}def cluster_compatibility(self) -> tuple[bool, str]:
        """``(True, reason)``: the state lives in the server, shared by every node."""
        return self._ops.cluster_compatibility()
'''
    #: What RepositoryCalls declares besides the operations of :data:`PUBLIC`.
    more_calls = (
        "    def migrate(self, *, settings: bool = True) -> Operation[None] | Spread[None]: ...",
        "",
        "    def cluster_compatibility(self) -> tuple[bool, str]: ...",
    )
    awaits = ""

    def operations(self) -> list[Op]:
        return repository_operations()

    def method(self, op: Op, sig: Signature) -> Method:
        return Method(params_text(sig.params), sig.answers)

    def body(self, op: Op) -> list[str]:
        ret = "return " if op.signature.answers != "None" else ""
        return wrap(8, f"{ret}{self.awaits}self._send(self._ops.{op.name}(", op.arg_list(),
                    "))")

    #: Whether its file defines RepositoryCalls (the asyncio one imports it).
    calls = True

    def render(self, ops: list[Op]) -> str:
        if not self.calls:
            return super().render(ops)
        # What the mixin calls: the core's operations, one partition's or a repository of
        # partitions' alike (a Protocol, so the mixin stands below both).
        calls = ["class RepositoryCalls(Protocol):",
                 '    """The repository\'s operations a store sends, one partition\'s or '
                 'many\'s."""']
        for op in ops:
            answers = f"Operation[{op.signature.answers}] | Spread[{op.signature.answers}]"
            calls.append("")
            calls.extend(wrap(4, f"def {op.name}(", params_text(op.signature.params),
                              f") -> {answers}: ...", orphan=True))
        calls.extend(["", *self.more_calls])
        return "\n".join(calls) + "\n\n\n" + super().render(ops)


class AsyncRepositories(Repositories):
    """:class:`redisstore.AsyncRedisRepository`'s methods."""

    path = "shells/repo_aio_ops.py"
    cls = "AsyncRepositoryStoreOps"
    about = ("The repository's methods of :class:`redisstore.AsyncRedisRepository`, each\n"
             "the core's (:class:`redisstore.core.repository_ops.RepositoryOps`) awaited by\n"
             "the store's ``_send``.")
    primitives = '''
    _ops: RepositoryCalls

    async def _send(self, op: Operation[T] | Spread[T]) -> T:
        """Send ``op``; its answer."""
        raise NotImplementedError

    def _settings(self) -> bool:
        """Whether ``migrate()`` checks the server's settings (fakeredis has none)."""
        raise NotImplementedError
'''
    asynchronous = True
    awaits = "await "
    calls = False


#: A session's steps, as what ``_call`` makes of them (``sessions._SessionValues``).
STEPS = "Generator[Callable[[Any], Any], Any, {}]"


class Sessions(Target):
    """:class:`redisstore.Session`'s calls, and :class:`redisstore.AsyncSession`'s (the
    asyncio class below the sync one, in the same file)."""

    path = "session_ops.py"
    cls = "SessionMethods"
    about = ("A session's calls (:class:`redisstore.Session`; ``AsyncSessionMethods``:\n"
             ":class:`redisstore.AsyncSession`'s, awaited), each its steps (written once in\n"
             ":mod:`redisstore.sessions`) made by the session's ``_call``; its claims are the\n"
             "run store's (:class:`redisstore.core.runops.RunOps`'s marked\n"
             "``@operation(\"claim\", ...)``), each of its kind.")
    primitives = '''
    __slots__ = ()

    {async_}def _call(self, steps: STEPS[T]) -> T:
        """What ``steps`` answer, each step made on the session's store."""
        raise NotImplementedError

    def _keeping(self) -> STEPS[Kept]:
        raise NotImplementedError

    def _claiming(self, kind: str, limit: object, records: object, block: object,
                  max_takeovers: object) -> STEPS[list[Any]]:
        raise NotImplementedError

    def _closing(self) -> STEPS[int]:
        raise NotImplementedError
'''
    also = '''
    {async_}def keepalive(self) -> Kept:
        """Keep the session live ``ttl`` ms from now, in one call whatever the number of
        runs; returns the runs taken from it since the last keepalive (a ``Seize``, a
        release, a delete...; at most ``CLOSE_STEP``, the rest at the next).
        ``SessionLapsed`` when it is not live: nothing changes, it never comes back. On a
        store of partitions, one call to each partition at once: ``Kept.lapsed`` names the
        partitions where it lapsed (their runs are lost; it goes on in the others), and
        ``SessionLapsed`` comes once it lapsed in all."""
        return {await_}self._call(self._keeping())

    {async_}def close(self) -> int:
        """Release every run the session holds (as ``release`` does), in steps of at most
        ``CLOSE_STEP`` runs, then end it; returns how many runs it released. Closing a
        closed or lapsed session releases what is left in it (nothing, once closed)."""
        return {await_}self._call(self._closing())

    {async_}def __{a}enter__(self) -> Self:
        return self

    {async_}def __{a}exit__(self, *exc: object) -> None:
        {await_}self.close()
'''

    def wants(self, op: Op) -> bool:
        return op.kind == "claim"

    def overloads(self, op: Op) -> tuple[Signature, ...]:
        return tuple(o for o in op.overloads if o != op.signature)

    def _params(self, sig: Signature) -> list[str]:
        params = params_text(tuple(p for p in sig.params if p.name not in ("owner", "ttl")))
        params = [*params, BLOCK] if "*" in params else [*params, "*", BLOCK]
        if not any(p.startswith("max_takeovers:") for p in params):
            params.append("max_takeovers: int | None = None")
        return params

    def method(self, op: Op, sig: Signature) -> Method:
        return Method(self._params(sig), runs_of(sig.answers))

    def doc(self, op: Op) -> str:
        unused = ("" if any(p.name == "max_takeovers" for p in op.signature.params)
                  else " (``max_takeovers`` plays no part)")
        return textwrap.fill(f"``store.{op.name}`` for the session's owner{unused}, the runs "
                             "taken under the session; ``SessionLapsed`` (nothing claimed) "
                             "when it is not live.", WIDTH - 12)

    def body(self, op: Op) -> list[str]:
        await_ = "await " if self.asynchronous else ""
        return wrap(8, f"return {await_}self._call(self._claiming(",
                    [f'"{_index(op)}"', "limit", "records", "block", "max_takeovers"], "))")

    def render(self, ops: list[Op]) -> str:
        sync = self._one(ops, False)
        aio = self._one(ops, True)
        return sync + "\n\n" + aio

    def _one(self, ops: list[Op], asynchronous: bool) -> str:
        self.asynchronous = asynchronous
        self.cls = "AsyncSessionMethods" if asynchronous else "SessionMethods"
        saved = self.primitives
        self.primitives = saved.format(async_="async " if asynchronous else "").replace(
            "STEPS[T]", STEPS.format("T")).replace("STEPS[Kept]", STEPS.format("Kept")).replace(
            "STEPS[list[Any]]", STEPS.format("list[Any]")).replace("STEPS[int]",
                                                                    STEPS.format("int"))
        try:
            made = super().render(ops)
        finally:
            self.primitives, self.asynchronous, self.cls = saved, False, "SessionMethods"
        return made


TARGETS: list[Target] = [Stores(), AsyncStores(), Pipelines(), Partitions(), Repositories(),
                         AsyncRepositories(), Sessions()]


def module(target: Target, ops: list[Op] | None = None) -> str:
    """The text of ``target``'s file (``ops``: its operations, else its own)."""
    ops = target.operations() if ops is None else ops
    body = target.render(ops)
    tree = ast.parse(body)
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for node in ast.walk(tree):
        annotations: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations = [a.annotation for a in (*node.args.args, *node.args.kwonlyargs)]
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in annotations:
            for part in ast.walk(annotation) if annotation is not None else ():
                if isinstance(part, ast.Name) and part.id not in IMPORTS \
                        and part.id not in BUILTINS and part.id not in RUNTIME:
                    raise ValueError(f"{target.path}: where does {part.id} come from? "
                                     "Add it to redisstore.build.ops.IMPORTS")
    imports: dict[str, set[str]] = {m: set(names) for m, names in ALWAYS.items()}
    if "(Protocol)" in body:
        imports["typing"].add("Protocol")
    if "@overload" not in body:
        imports["typing"].discard("overload")
    own = "redisstore." + target.path.removesuffix(".py").replace("/", ".")
    for name in sorted(used & IMPORTS.keys()):
        if IMPORTS[name] != own:  # what the file defines itself
            imports.setdefault(IMPORTS[name], set()).add(name)
    runtime = [m for m in sorted(imports) if not m.startswith("redisstore.")
               and m != "datetime"]
    typed = [m for m in sorted(imports) if m == "datetime"]
    local = sorted((_relative(m, target.path), m) for m in imports if m.startswith("redisstore."))
    values: dict[str, set[str]] = {}
    for name in sorted(used & RUNTIME.keys()):
        values.setdefault(_relative(RUNTIME[name], target.path), set()).add(name)
    lines = [
        f"# Generated by `python -m redisstore.build.ops` from {target.origin}: do not "
        "edit.",
        f"# Change the operation in {target.origin} (or the generator), then run that "
        "again.",
        f'"""{target.about.splitlines()[0]}',
        *target.about.splitlines()[1:],
        "",
        "Generated (redisstore/build/ops.py): tests/codegen/test_generated.py checks it is "
        "current.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
    ]
    for source in runtime:
        lines.extend(wrap(0, f"from {source} import ", sorted(imports[source], key=_isort), ""))
    if values:
        lines.append("")
    for source, names in sorted(values.items()):
        lines.extend(wrap(0, f"from {source} import ", sorted(names, key=_isort), ""))
    lines += ["", "if TYPE_CHECKING:"]
    for source in typed:
        lines.extend(wrap(4, f"from {source} import ", sorted(imports[source], key=_isort), ""))
    if typed:
        lines.append("")
    for source, absolute in local:
        lines.extend(wrap(4, f"from {source} import ", sorted(imports[absolute], key=_isort), ""))
    lines += ["", 'T = TypeVar("T")', "", "", ""]
    return "\n".join(lines) + body


def _relative(module: str, path: str) -> str:
    """``module`` (``redisstore.x.y``) as the generated file at ``path`` imports it."""
    here = ["redisstore", *path.split("/")[:-1]]
    there = module.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return "." * (len(here) - common + 1) + ".".join(there[common:])


def _isort(name: str) -> tuple[int, str]:
    """isort's order by type: constants, classes, the rest."""
    if name.isupper() and len(name) > 1:
        return 0, name
    return (1, name) if name[0].isupper() else (2, name)


def generated() -> dict[Path, str]:
    """Every generated file's path and text, made now from the core."""
    return {PACKAGE / target.path: module(target) for target in TARGETS}


def stale() -> list[Path]:
    """The generated files that differ from what the core makes now."""
    return [path for path, text in generated().items()
            if not path.exists() or path.read_text() != text]


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        old = stale()
        for path in old:
            print(f"{path} is stale: run python -m redisstore.build.ops", file=sys.stderr)
        return 1 if old else 0
    if argv[1:]:
        print("usage: python -m redisstore.build.ops [--check]", file=sys.stderr)
        return 2
    for path, text in generated().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
