"""Sandboxed CodeAct executor: run language-model-written Python cells in-process.

Threat model
------------
An agent (a language model) writes Python *cells* that call host-provided tool
functions.  The code is untrusted: it may be buggy (infinite loops, huge
allocations, deep recursion) or hostile (attempts to reach ``os``, the host's
globals, frames, or the event loop).  Whatever a cell does, the host must get
back a :class:`CellResult` -- never a crash, a hang or an escape.  Each
:class:`SandboxExecutor` keeps one persistent namespace; cells run one after
another in it, as in a notebook, and run in the host process (no subprocess, no
thread) so that a warm cell costs a few microseconds.

Mechanisms
----------
* **AST validation** (cached per source): every name, attribute, argument,
  keyword, alias, function name or ``global``/``nonlocal`` name starting with
  ``_`` is rejected (this blocks all dunder tricks: ``().__class__``,
  ``__import__``, ``__builtins__`` ...), as are attributes that leak frames, code
  or the event loop (``gi_frame``, ``f_globals``, ``get_loop``, ...) and
  ``str.format`` (its ``{0.__class__}`` fields are an attribute-access channel).
  ``class``, ``try/except*``, imports other than ``asyncio``, and
  ``break``/``continue``/``return`` inside ``finally`` (they could swallow the
  timeout) are rejected too.  Bare ``except:`` is rewritten to
  ``except Exception:``.
* **Restricted builtins**: a whitelist (no ``open``/``exec``/``eval``/
  ``getattr``/``type``/``object``/...), a sandbox ``print`` writing into the
  cell's own buffer (``sys.stdout`` is never touched, so executors may be
  interleaved on one event loop), and an ``__import__`` that only returns a
  restricted ``asyncio`` module exposing ``gather``.
* **Ticks**: the AST is instrumented with a call to a private tick function at
  the top of every loop and function body, in every lambda and as an extra
  always-true condition of every comprehension.  Ticks are counted against
  ``max_ticks`` and, every 16 ticks, the wall time against ``time_limit_s``.
  The resulting :class:`SandboxTimeout` derives from ``BaseException`` so
  ``except Exception`` cannot swallow it, and once tripped every later tick
  raises again.  ``map``/``filter``/``zip``/``enumerate`` are ticking
  generators (so C callables mapped over long inputs are counted too) and
  ``iter`` refuses the endless ``iter(callable, sentinel)`` form.
* **Size guards**: ``*``, ``**``, ``<<``, ``+`` (and ``*=``, ``**=``, ``<<=``, ``+=``)
  and the ``pow``/``range`` builtins pre-check the size of int and sequence results
  (``max_int_bits``, ``max_sequence_len``) before computing them. ``+`` on two
  sequences doubles one in a single operation (``s = s + s``), which no tick
  interrupts: uncapped, a doubling cell ran 14 s against a 5 s time limit before the
  memory window stopped it; capped, it stops at the length limit in well under a
  second.
* **Memory window**: while the cell's own code runs, the soft ``RLIMIT_AS`` is
  lowered to the current virtual size plus ``memory_limit_mb`` (Linux), so an
  allocation that slips past the guards (``'a'.ljust(10**11)``) raises
  ``MemoryError`` instead of exhausting the machine.
* **Slices**: a cell with top-level ``await`` is driven by hand: each
  synchronous slice (``coro.send``/``coro.throw``) runs inside the time and
  memory window, and the future it yields is awaited outside it.  Awaiting an
  async tool schedules the tool as its own task, so tool work (e.g. a whole
  child agent) is neither timed nor memory-limited as the parent's.  User
  coroutines passed to ``asyncio.gather`` are driven the same way.  An async
  tool called without ``await`` is closed unrun and reported.

Known limits
------------
* A single C-level builtin call cannot be interrupted: inputs are size-capped,
  but quadratic work inside one call (``max([big_list] * 10**7)``) can run for a
  long time before the next tick; likewise the timer is only checked every 16
  ticks.
* CPython 3.11 recurses in C without a guard in a few places, so objects
  nested tens of thousands of levels deep (a chain of ~40k generators that
  fails mid-iteration, hashing a tuple nested ~10**6 deep) can still overflow
  the C stack; building them takes that many ticks, which the default
  ``max_ticks`` allows.
* ``RLIMIT_AS`` is process-wide: during a slice, other threads of the host share
  the same (generous) window; it is restored after every slice.  Memory kept in
  the namespace survives between cells and is not capped.
* Objects returned by tools are exposed as they are: the host must not return
  objects whose public attributes or methods give power (e.g. event loops).

The sandbox is one security boundary (AST checks, restricted builtins, limits, the
worker process); keeping it in one module keeps its rules reviewable together.
"""
from __future__ import annotations

import ast
import asyncio
import builtins
import inspect
import math
import os
import types
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from time import perf_counter
from typing import Any, NamedTuple

try:
    import resource
except ImportError:  # pragma: no cover - non-Unix platforms
    resource = None  # type: ignore[assignment]

__all__ = ["CellResult", "SandboxExecutor", "SandboxLimits", "SandboxTimeout"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to every cell.

    ``time_limit_s`` and ``memory_limit_mb`` only apply while the cell's own code
    runs (its synchronous slices); time spent awaiting async tools is excluded.
    ``max_ticks`` is a deterministic budget of loop iterations, function calls
    and comprehension items.  ``max_sequence_len`` and ``max_int_bits`` cap the
    results of ``*``, ``**``, ``<<``, ``pow`` and ``range`` before they are
    computed.  ``max_output_chars`` caps the text a cell may produce.
    """

    time_limit_s: float = 5.0
    """Wall time the cell's own code may run (time awaiting async tools excluded)."""
    max_ticks: int = 2_000_000
    """Deterministic budget: loop iterations + function calls + comprehension items."""
    max_output_chars: int = 8_000
    """Output cap; beyond it output is cut and a marker says how much was dropped."""
    max_sequence_len: int = 10_000_000
    """Cap for the results of ``seq * int``, the length of ``range()``, etc."""
    max_int_bits: int = 100_000
    """Cap for the size in bits of int results of ``**``, ``*`` and ``<<``."""
    memory_limit_mb: int = 1024
    """Extra address space allowed while the cell's code runs (Linux RLIMIT_AS); 0 disables."""


@dataclass
class CellResult:
    """Outcome of one cell.

    ``error_kind`` is ``None`` on success, else one of ``"syntax"``,
    ``"forbidden"``, ``"runtime"``, ``"timeout"``, ``"memory"``, ``"unawaited"``;
    ``ticks`` and ``seconds`` are the ticks and in-slice wall time used.
    """

    output: str
    error: str | None
    error_kind: str | None
    ticks: int
    seconds: float

    @property
    def observation(self) -> str:
        """What the agent sees next turn: the output, then the error text if any."""
        if self.error is None:
            return self.output
        output = self.output.rstrip("\n")
        return f"{output}\n{self.error}" if output else self.error


class SandboxTimeout(BaseException):
    """Raised by the tick function when a cell exceeds its time or tick budget.

    A ``BaseException`` so that the cell's ``except Exception`` cannot catch it.
    """


# --------------------------------------------------------------------------- #
# Source -> validated, instrumented code object (cached)
# --------------------------------------------------------------------------- #

_CELL = "<cell>"
_TICK, _ECHO, _OBJ, _KEY = "_sbx_tick", "_sbx_echo", "_sbx_obj", "_sbx_key"
_BIN_GUARDS = {ast.Mult: "_sbx_mul", ast.Pow: "_sbx_pow", ast.LShift: "_sbx_lshift", ast.Add: "_sbx_add"}
_AUG_GUARDS = {ast.Mult: "_sbx_imul", ast.Pow: "_sbx_ipow", ast.LShift: "_sbx_ilshift", ast.Add: "_sbx_iadd"}
_DENIED_ATTRS = frozenset(
    "gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await ag_frame ag_code ag_await "
    "f_globals f_locals f_builtins f_back f_code f_trace tb_frame tb_next co_code mro "
    "format format_map get_loop get_stack print_stack get_coro add_done_callback".split()
)
_IMPORT_ERROR = "import of {!r} is not allowed in this sandbox; only `asyncio` (for gather) is available"


class _Forbidden(Exception):
    def __init__(self, node: ast.AST, what: str) -> None:
        super().__init__(f"Forbidden (line {getattr(node, 'lineno', '?')}): {what}")


def _check_name(name: str | None, node: ast.AST, what: str) -> None:
    if name and name.startswith("_") and name != "_":
        raise _Forbidden(node, f"{what} {name!r}: names starting with '_' are not allowed in this sandbox")


def _check_attr(attr: str, node: ast.AST) -> None:
    _check_name(attr, node, "attribute")
    if attr in _DENIED_ATTRS:
        hint = " (use f-strings)" if attr.startswith("format") else ""
        raise _Forbidden(node, f"attribute {attr!r} is not allowed in this sandbox{hint}")


class _Validator(ast.NodeVisitor):
    """Rejects constructs that could escape the sandbox or swallow its timeout."""

    def __init__(self) -> None:
        self.in_finally, self.loops = False, 0

    def _scoped(self, nodes: list[ast.AST], in_finally: bool, loops: int) -> None:
        saved = self.in_finally, self.loops
        self.in_finally, self.loops = in_finally, loops
        for n in nodes:
            self.visit(n)
        self.in_finally, self.loops = saved

    def visit_Name(self, node: ast.Name) -> None:
        _check_name(node.id, node, "name")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        _check_attr(node.attr, node)
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        _check_name(node.arg, node, "argument")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        _check_name(node.arg, node, "keyword argument")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        for name in node.names:
            _check_name(name, node, "name")

    visit_Nonlocal = visit_Global

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        _check_name(node.name, node, "name")
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs | ast.MatchStar) -> None:
        _check_name(node.name, node, "name")
        self.generic_visit(node)

    visit_MatchStar = visit_MatchAs

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        _check_name(node.rest, node, "name")
        self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:
            _check_attr(attr, node)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        raise _Forbidden(node, "class definitions are not supported in this sandbox")

    def visit_TryStar(self, node: ast.AST) -> None:
        raise _Forbidden(node, "try/except* is not supported in this sandbox")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name != "asyncio":
                raise _Forbidden(node, _IMPORT_ERROR.format(alias.name))
            _check_name(alias.asname, node, "name")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module != "asyncio" or node.level:
            raise _Forbidden(node, _IMPORT_ERROR.format("." * node.level + (node.module or "")))
        for alias in node.names:
            _check_name(alias.name, node, "name")
            _check_name(alias.asname, node, "name")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if not isinstance(node, ast.Lambda):
            _check_name(node.name, node, "function name")
        saved = self.in_finally, self.loops
        self.in_finally, self.loops = False, 0
        self.generic_visit(node)
        self.in_finally, self.loops = saved

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_For(self, node: ast.For | ast.AsyncFor | ast.While) -> None:
        head = [node.test] if isinstance(node, ast.While) else [node.target, node.iter]
        self._scoped(head, self.in_finally, self.loops)
        self._scoped(node.body, self.in_finally, self.loops + 1)
        self._scoped(node.orelse, self.in_finally, self.loops)  # `else: break` binds to the outer loop

    visit_AsyncFor = visit_While = visit_For

    def visit_Try(self, node: ast.Try) -> None:
        self._scoped([*node.body, *node.handlers, *node.orelse], self.in_finally, self.loops)
        self._scoped(node.finalbody, True, 0)

    def visit_Break(self, node: ast.Break | ast.Continue) -> None:
        if self.in_finally and not self.loops:
            raise _Forbidden(node, f"`{type(node).__name__.lower()}` inside a `finally` block is not allowed")

    visit_Continue = visit_Break

    def visit_Return(self, node: ast.Return) -> None:
        if self.in_finally:
            raise _Forbidden(node, "`return` inside a `finally` block is not allowed")
        self.generic_visit(node)


def _at(node: ast.AST, ref: ast.AST) -> ast.AST:
    """Give a new node ``ref``'s source position (so tracebacks name the user's line)."""
    return ast.copy_location(node, ref)


def _load(name: str, ref: ast.AST) -> ast.Name:
    return _at(ast.Name(name, ast.Load()), ref)


def _call(name: str, ref: ast.AST, *args: ast.expr) -> ast.Call:
    return _at(ast.Call(_load(name, ref), list(args), []), ref)


def _assign(name: str, value: ast.expr, ref: ast.AST) -> ast.Assign:
    return _at(ast.Assign([_at(ast.Name(name, ast.Store()), ref)], value), ref)


class _Instrumenter(ast.NodeTransformer):
    """Inserts ticks and size guards (only private `_sbx_*` names, after validation).

    Every node it creates gets a source position here, so the tree needs no
    ``ast.fix_missing_locations`` pass (a whole-tree walk, ~20% of a cold cell).
    """

    def visit_For(self, node: ast.For | ast.AsyncFor | ast.While | ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        """Tick at the top of every loop body and function body."""
        self.generic_visit(node)
        first = node.body[0]
        node.body.insert(0, _at(ast.Expr(_call(_TICK, first)), first))
        return node

    visit_AsyncFor = visit_While = visit_FunctionDef = visit_AsyncFunctionDef = visit_For

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self.generic_visit(node)
        node.body = _at(ast.BoolOp(ast.And(), [_call(_TICK, node.body), node.body]), node.body)
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        self.generic_visit(node)
        node.ifs.insert(0, _call(_TICK, node.iter))
        return node

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.AST:
        self.generic_visit(node)
        if node.type is None:
            node.type = _load("Exception", node)
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        guard = _BIN_GUARDS.get(type(node.op))
        return _call(guard, node, node.left, node.right) if guard else node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST | list[ast.stmt]:
        """`t op= v` -> `t = guard(t, v)`, evaluating a subscript/attribute target's parts once."""
        self.generic_visit(node)
        guard = _AUG_GUARDS.get(type(node.op))
        if guard is None:
            return node
        target, pre, contexts = node.target, [], (ast.Load(), ast.Store())
        load: ast.expr
        store: ast.expr
        if isinstance(target, ast.Subscript):
            pre = [_assign(_OBJ, target.value, node), _assign(_KEY, target.slice, node)]
            load, store = (_at(ast.Subscript(_load(_OBJ, node), _load(_KEY, node), ctx), node) for ctx in contexts)
        elif isinstance(target, ast.Attribute):
            pre = [_assign(_OBJ, target.value, node)]
            load, store = (_at(ast.Attribute(_load(_OBJ, node), target.attr, ctx), node) for ctx in contexts)
        else:
            load, store = (_at(ast.Name(target.id, ctx), node) for ctx in contexts)  # type: ignore[union-attr]
        return [*pre, _at(ast.Assign([store], _call(guard, node, load, node.value)), node)]


class _Prepared(NamedTuple):
    code: types.CodeType | None
    is_async: bool
    error_kind: str | None = None
    error: str | None = None


@lru_cache(maxsize=512)
def _prepare(source: str) -> _Prepared:
    """Parse, validate, instrument and compile a cell (or describe why it cannot run)."""
    try:
        tree = ast.parse(source, _CELL)
        _Validator().visit(tree)
        tree = _Instrumenter().visit(tree)
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body[-1]
            last.value = _call(_ECHO, last.value, last.value)
        code = compile(tree, _CELL, "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, True)
    except SyntaxError as exc:
        line = exc.text or (source.splitlines()[exc.lineno - 1] if exc.lineno else "")
        where = f" (line {exc.lineno}): {line.strip()}" if exc.lineno else ""
        return _Prepared(None, False, "syntax", f"{type(exc).__name__}: {exc.msg}{where}")
    except _Forbidden as exc:
        return _Prepared(None, False, "forbidden", str(exc))
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:
        message = f"SyntaxError: cannot compile this cell ({type(exc).__name__}: {exc})"
        return _Prepared(None, False, "syntax", message)
    return _Prepared(code, bool(code.co_flags & inspect.CO_COROUTINE))


# --------------------------------------------------------------------------- #
# Memory window (soft RLIMIT_AS)
# --------------------------------------------------------------------------- #

_STATM: tuple[int, int] | None = None  # (pid, fd of /proc/self/statm)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _lower_address_space(extra: int) -> tuple[int, int] | None:
    """Set the soft RLIMIT_AS to current size + `extra`; return the limits to restore."""
    global _STATM
    try:
        if _STATM is None or _STATM[0] != os.getpid():
            _STATM = (os.getpid(), os.open("/proc/self/statm", os.O_RDONLY))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        new = int(os.pread(_STATM[1], 64, 0).split()[0]) * _PAGE + extra
        if hard != resource.RLIM_INFINITY:
            new = min(new, hard)
        if soft != resource.RLIM_INFINITY and soft <= new:
            return None
        resource.setrlimit(resource.RLIMIT_AS, (new, hard))
        return soft, hard
    except (OSError, ValueError):  # no /proc/self/statm, limit not settable, ...
        return None


# --------------------------------------------------------------------------- #
# Executor
# --------------------------------------------------------------------------- #

_SAFE_BUILTINS = (
    "abs all any bool callable chr dict divmod float frozenset hash int isinstance issubclass "
    "len list max min next ord repr reversed round set slice sorted str sum tuple True False None "
    "Exception ArithmeticError AssertionError AttributeError IndexError KeyError LookupError "
    "NameError RuntimeError StopIteration TypeError ValueError ZeroDivisionError"
).split()
_HIDDEN_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_")) - set(_SAFE_BUILTINS)
_SEQUENCES = (str, bytes, list, tuple)
_CHECK_EVERY = 16  # ticks between wall-clock checks


async def _await_tool(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run an async tool as its own task, so its work happens outside the cell's slices."""
    return await asyncio.ensure_future(fn(*args, **kwargs))


_TOOL_CODE = _await_tool.__code__


class _Pass:
    """Awaitable that hands a future yielded by the cell coroutine to the running task."""

    __slots__ = ("fut",)

    def __init__(self, fut: Any) -> None:
        self.fut = fut

    def __await__(self) -> Any:
        return (yield self.fut)


def _host_is_cancelling() -> bool:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return False
    return task is not None and task.cancelling() > 0


class SandboxExecutor:
    """Runs untrusted Python cells in one persistent, restricted namespace.

    ``tools`` maps names to plain or ``async def`` callables exposed in the
    namespace (async ones must be awaited by the cell).  Use :meth:`run` from
    synchronous code and :meth:`run_async` from inside an event loop; neither
    raises for anything the cell does (see the module docstring).  One executor
    runs one cell at a time.
    """

    def __init__(self, tools: Mapping[str, Callable[..., Any]], limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        for name in tools:
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"invalid tool name {name!r}")
        self._tools = {name: self._expose(name, fn) for name, fn in tools.items()}
        self._ns: dict[str, Any] = {"__builtins__": self._make_builtins(), **self._tools}
        self._mem_extra = self.limits.memory_limit_mb * 2**20 if resource is not None else 0
        self._busy = False
        self._ticks, self._next_check, self._trip = 0, 0, ""
        self._t0 = self._elapsed = 0.0
        self._out: list[str] = []
        self._out_len = self._dropped = 0
        self._spawned: list[tuple[str, Coroutine[Any, Any, Any]]] = []

    @property
    def namespace(self) -> dict[str, Any]:
        """A copy of the user-visible variables (no private names, builtins or tools)."""
        return {k: v for k, v in self._ns.items() if not k.startswith("_") and self._tools.get(k) is not v}

    # -- public entry points -------------------------------------------------

    def run(self, code: str) -> CellResult:
        """Run one cell synchronously.

        A cell with top-level ``await`` is driven on a private new event loop;
        calling this for such a cell from inside a running loop raises
        ``RuntimeError`` (use :meth:`run_async` there).
        """
        prep = _prepare(code)
        if not prep.is_async:
            return self._run_sync(prep)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("this cell uses `await`; inside an event loop use `await executor.run_async(code)`")
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self._run_coro(prep))
        finally:
            leftovers = asyncio.all_tasks(loop)
            for task in leftovers:
                task.cancel()
            if leftovers:
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
            loop.close()

    async def run_async(self, code: str) -> CellResult:
        """Run one cell on the running event loop (required for cells that await tools there)."""
        prep = _prepare(code)
        return await self._run_coro(prep) if prep.is_async else self._run_sync(prep)

    # -- cell lifecycle --------------------------------------------------------

    def _run_sync(self, prep: _Prepared) -> CellResult:
        if prep.code is None:
            return CellResult("", prep.error, prep.error_kind, 0, 0.0)
        self._begin()
        try:
            limits = self._enter()
            try:
                eval(prep.code, self._ns)
            finally:
                self._exit(limits)
        except BaseException as exc:
            return self._fail(exc)
        return self._end(None, None)

    async def _run_coro(self, prep: _Prepared) -> CellResult:
        self._begin()
        try:
            await self._drive(eval(prep.code, self._ns))
        except BaseException as exc:
            return self._fail(exc)
        return self._end(None, None)

    def _begin(self) -> None:
        if self._busy:
            raise RuntimeError("this SandboxExecutor is already running a cell")
        self._busy = True
        self._ticks, self._next_check, self._trip = 0, min(_CHECK_EVERY, self.limits.max_ticks + 1), ""
        self._elapsed = 0.0
        self._out_len = self._dropped = 0

    def _end(self, kind: str | None, error: str | None) -> CellResult:
        unawaited = []
        for name, coro in self._spawned:
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()
                unawaited.append(name)
        self._spawned.clear()
        if kind is None and self._trip:  # a timeout was caught by gather(return_exceptions=True)
            kind, error = "timeout", self._trip
        if kind is None and unawaited:
            kind, error = "unawaited", " ".join(
                f"{n}(...) was called without `await`, so it did not run. "
                f"Write `await {n}(...)` (or `await asyncio.gather(...)`)."
                for n in dict.fromkeys(unawaited)
            )
        output = "".join(self._out)
        if self._dropped:
            output += f"\n... [output truncated: {self._dropped} more characters]"
        self._out.clear()
        self._busy = False
        return CellResult(output, error, kind, self._ticks, self._elapsed)

    def _fail(self, exc: BaseException) -> CellResult:
        """Turn an exception escaping the cell into a result (host-level ones are re-raised)."""
        if isinstance(exc, (KeyboardInterrupt, GeneratorExit)) or (
            isinstance(exc, asyncio.CancelledError) and _host_is_cancelling()
        ):
            self._end(None, None)
            raise exc
        if isinstance(exc, SandboxTimeout):
            kind, text = "timeout", str(exc)
        else:
            kind = "memory" if isinstance(exc, MemoryError) else "runtime"
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if kind == "memory" and not str(exc):
                text += f": out of memory (a cell may use at most {self.limits.memory_limit_mb} MB more)"
            if isinstance(exc, NameError) and exc.name in _HIDDEN_BUILTINS:
                text += f" (`{exc.name}` is not available in this sandbox)"
        return self._end(kind, f"Traceback: {_where(exc.__traceback__)}{text[:2000]}")

    # -- slices ------------------------------------------------------------------

    def _enter(self) -> tuple[int, int] | None:
        self._t0 = perf_counter()
        return _lower_address_space(self._mem_extra) if self._mem_extra else None

    def _exit(self, limits: tuple[int, int] | None) -> None:
        if limits is not None:
            resource.setrlimit(resource.RLIMIT_AS, limits)
        self._elapsed += perf_counter() - self._t0

    async def _drive(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` with limits active only during its synchronous slices."""
        step, arg = coro.send, None
        while True:
            limits = self._enter()
            try:
                fut = step(arg)
            except StopIteration as stop:
                return stop.value
            finally:
                self._exit(limits)
            try:
                step, arg = coro.send, await _Pass(fut)
            except BaseException as exc:  # incl. CancelledError: forward it into the cell
                step, arg = coro.throw, exc

    # -- namespace contents ------------------------------------------------------

    def _expose(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a tool so the cell sees a plain function (no access to bound objects)."""
        if inspect.iscoroutinefunction(fn):

            def tool(*args: Any, **kwargs: Any) -> Any:
                coro = _await_tool(fn, args, kwargs)
                coro.__name__ = coro.__qualname__ = name
                self._spawned.append((name, coro))
                return coro

        else:

            def tool(*args: Any, **kwargs: Any) -> Any:
                return fn(*args, **kwargs)

        tool.__name__ = tool.__qualname__ = name
        return tool

    def _make_builtins(self) -> dict[str, Any]:
        """The restricted builtins: whitelist, sandbox replacements and the private hooks."""
        lim = self.limits
        max_bits, max_len, cap = lim.max_int_bits, lim.max_sequence_len, lim.max_output_chars

        def check() -> None:
            if not self._trip:
                if self._ticks > lim.max_ticks:
                    self._trip = (
                        f"Timeout: the cell exceeded its budget of {lim.max_ticks:,} steps (loop iterations + "
                        "function calls); is there an infinite loop?"
                    )
                elif self._elapsed + perf_counter() - self._t0 > lim.time_limit_s:
                    self._trip = (
                        f"Timeout: the cell exceeded its time limit of {lim.time_limit_s:g} s; "
                        "is there an infinite loop?"
                    )
                else:
                    self._next_check = min(self._ticks + _CHECK_EVERY, lim.max_ticks + 1)
                    return
                self._next_check = 0
            raise SandboxTimeout(self._trip)

        def tick() -> bool:
            self._ticks += 1
            if self._ticks >= self._next_check:
                check()
            return True

        def write(text: str) -> None:
            room = cap - self._out_len
            if len(text) <= room:
                if text:
                    self._out.append(text)
                    self._out_len += len(text)
            else:
                if room:
                    self._out.append(text[:room])
                self._out_len = cap
                self._dropped += len(text) - room

        def print(
            *args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush: Any = False
        ) -> None:
            if file is not None:
                raise TypeError("print(file=...) is not supported: output always goes to the cell output")
            sep, end = " " if sep is None else sep, "\n" if end is None else end
            if not isinstance(sep, str) or not isinstance(end, str):
                raise TypeError("print(): sep and end must be None or strings")
            write(sep.join(builtins.map(str, args)) + end)

        def echo(value: Any) -> None:
            if value is not None:
                if self._out and not self._out[-1].endswith("\n"):
                    write("\n")
                write(_stable_repr(value))

        def too_large(what: str, unit: str) -> MemoryError:
            limit = max_bits if unit == "bits" else max_len
            return MemoryError(f"result too large: {what} would exceed the limit of {limit:,} {unit}")

        def check_mul(a: Any, b: Any) -> None:
            if isinstance(a, int) and isinstance(b, int):
                if a.bit_length() + b.bit_length() > max_bits:
                    raise too_large("int * int", "bits")
            elif isinstance(a, int) and isinstance(b, _SEQUENCES):
                check_mul(b, a)
            elif isinstance(a, _SEQUENCES) and isinstance(b, int) and len(a) * b > max_len:
                raise too_large(f"{type(a).__name__} * int", "items")

        def check_add(a: Any, b: Any) -> None:
            # `s = s + s` doubles a sequence in one operation, which no tick interrupts: capped
            # like `*`, so a doubling cell stops at the length limit instead of at the memory
            # limit (14 s against a 5 s time limit on a loaded machine, issue 59)
            if isinstance(a, _SEQUENCES) and isinstance(b, _SEQUENCES) and len(a) + len(b) > max_len:
                raise too_large(f"{type(a).__name__} + {type(b).__name__}", "items")

        def check_pow(a: Any, b: Any) -> None:
            if isinstance(a, int) and isinstance(b, int) and b > 1 and abs(a) > 1:
                if b > max_bits or b * math.log2(abs(a)) > max_bits:
                    raise too_large("int ** int", "bits")

        def check_lshift(a: Any, b: Any) -> None:
            if isinstance(a, int) and isinstance(b, int) and a and a.bit_length() + b > max_bits:
                raise too_large("int << int", "bits")

        def mul(a: Any, b: Any) -> Any:
            check_mul(a, b)
            return a * b

        def imul(a: Any, b: Any) -> Any:
            check_mul(a, b)
            a *= b
            return a

        def add(a: Any, b: Any) -> Any:
            check_add(a, b)
            return a + b

        def iadd(a: Any, b: Any) -> Any:
            check_add(a, b)
            a += b
            return a

        def power(a: Any, b: Any) -> Any:
            check_pow(a, b)
            return a**b

        def ipower(a: Any, b: Any) -> Any:
            check_pow(a, b)
            a **= b
            return a

        def lshift(a: Any, b: Any) -> Any:
            check_lshift(a, b)
            return a << b

        def ilshift(a: Any, b: Any) -> Any:
            check_lshift(a, b)
            a <<= b
            return a

        def pow(base: Any, exp: Any, mod: Any = None) -> Any:
            if mod is None:
                check_pow(base, exp)
            return builtins.pow(base, exp, mod)

        def range(*args: Any) -> builtins.range:
            r = builtins.range(*args)
            try:
                n = len(r)
            except OverflowError:
                n = max_len + 1
            if n > max_len:
                raise too_large("range()", "items")
            return r

        def iter(obj: Any, *sentinel: Any) -> Iterator[Any]:
            if sentinel:
                raise TypeError("iter(callable, sentinel) is not supported in this sandbox; write a while loop")
            return builtins.iter(obj)

        def map(function: Callable[..., Any], iterable: Any, *iterables: Any) -> Iterator[Any]:
            for args in builtins.zip(iterable, *iterables, strict=False):
                tick()
                yield function(*args)

        def filter(function: Callable[[Any], Any] | None, iterable: Any) -> Iterator[Any]:
            for item in builtins.filter(function, iterable):
                tick()
                yield item

        def zip(*iterables: Any, strict: bool = False) -> Iterator[tuple[Any, ...]]:
            for item in builtins.zip(*iterables, strict=strict):
                tick()
                yield item

        def enumerate(iterable: Any, start: int = 0) -> Iterator[tuple[int, Any]]:
            for item in builtins.enumerate(iterable, start):
                tick()
                yield item

        def gather(*aws: Any, return_exceptions: bool = False) -> asyncio.Future[list[Any]]:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("asyncio.gather(...) needs `await`: write `await asyncio.gather(...)`") from None
            return asyncio.gather(
                *(self._drive(a) if inspect.iscoroutine(a) and a.cr_code is not _TOOL_CODE else a for a in aws),
                return_exceptions=return_exceptions,
            )

        restricted_asyncio = types.ModuleType("asyncio", "Restricted asyncio: only `gather` is available.")
        restricted_asyncio.gather = gather  # type: ignore[attr-defined]
        restricted_asyncio.__all__ = ["gather"]  # type: ignore[attr-defined]

        def import_(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
            if name == "asyncio" and not level:
                return restricted_asyncio
            raise ImportError(_IMPORT_ERROR.format(name))

        visible = {f.__name__: f for f in (print, pow, range, iter, map, filter, zip, enumerate)}
        for f in (*visible.values(), gather):
            f.__qualname__ = f.__name__
        return {
            **{name: getattr(builtins, name) for name in _SAFE_BUILTINS},
            **visible,
            "__import__": import_,
            _TICK: tick,
            _ECHO: echo,
            _BIN_GUARDS[ast.Mult]: mul,
            _BIN_GUARDS[ast.Pow]: power,
            _BIN_GUARDS[ast.LShift]: lshift,
            _BIN_GUARDS[ast.Add]: add,
            _AUG_GUARDS[ast.Mult]: imul,
            _AUG_GUARDS[ast.Add]: iadd,
            _AUG_GUARDS[ast.Pow]: ipower,
            _AUG_GUARDS[ast.LShift]: ilshift,
        }


def _stable_repr(value: Any) -> str:
    """``repr`` for echoes, without memory addresses for functions and coroutines
    (so transcripts are identical from run to run)."""
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return f"<function {value.__name__}>"
    if inspect.iscoroutine(value) or inspect.isgenerator(value):
        return f"<{type(value).__name__} {value.__name__}>"
    return repr(value)


def _where(tb: types.TracebackType | None) -> str:
    """'line N: ' of the innermost cell frame (plus the calling line for functions)."""
    inner = outer = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _CELL:
            outer, inner = outer or tb, tb
        tb = tb.tb_next
    if inner is None:
        return ""
    where, name = f"line {inner.tb_lineno}", inner.tb_frame.f_code.co_name
    if name != "<module>":
        where += f" in {name}" + (f" (called from line {outer.tb_lineno})" if outer is not inner else "")
    return where + ": "
