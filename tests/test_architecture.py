"""The layout's rules, checked on the source: who may import whom, one home for state, sizes."""

from __future__ import annotations

import ast
import importlib
import io
import pathlib
import subprocess
import sys
import threading
import tokenize
import weakref
from collections import deque
from typing import Any

import pytest

import attnscope
from attnscope import _log
from attnscope._capture.sampling import OverheadBudget
from attnscope._runtime import runtime

ROOT = pathlib.Path(attnscope.__file__).parent
# Lines of code: docstrings, comments and blank lines are not counted (a cap on them would
# push why-comments out).
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: pathlib.Path) -> set[str]:
    """Every module ``module`` imports at run time (function-level imports included)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:  # "from . import x" may name a submodule
                found.add(f"{target}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


MODULES = _modules()
GRAPH = {name: {i for i in _imports(name, path) if i in MODULES and i != name}
         for name, path in MODULES.items()}
RAW = {name: _imports(name, path) for name, path in MODULES.items()}


def _side(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _bad_imports(sides: tuple[str, ...], banned: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules of ``sides`` that import (at run time) anything starting with ``banned``."""
    out = {}
    for name, imported in RAW.items():
        if _side(name) in sides:
            bad = sorted(i for i in imported if i.startswith(banned))
            if bad:
                out[name] = bad
    return out


def test_capture_never_imports_the_worker_side_or_the_sdk() -> None:
    # The calling thread hands one plain record to submit(): it never loads what builds spans.
    assert not _bad_imports(("_capture",), ("attnscope._worker", "attnscope._derive",
                                           "attnscope._spans", "attnscope._profiles",
                                           "attnscope._export", "attnscope._instrument",
                                           "attnscope._api", "opentelemetry.sdk"))


def test_worker_never_imports_the_capture_side() -> None:
    # What both sides read is in record/; the worker reaches nothing else of the calling side.
    assert not _bad_imports(("_worker", "_derive", "_spans", "_profiles"), ("attnscope._capture",))


def test_the_derivation_makes_no_thread_and_no_span() -> None:
    # _derive/ says what a record means; the worker and the span builder both call it, so it
    # imports neither of them (that would be a circle), nor the exporters or OpenTelemetry.
    assert not _bad_imports(("_derive",), ("attnscope._capture", "attnscope._worker",
                                           "attnscope._spans", "attnscope._profiles",
                                           "attnscope._export", "attnscope._api",
                                           "opentelemetry", "threading"))


def test_record_imports_neither_side() -> None:
    # Both sides import record/, so record/ importing either would be a circle, or would load
    # the SDK on the calling thread.
    assert not _bad_imports(("_record",), ("attnscope._capture", "attnscope._worker",
                                          "attnscope._export", "attnscope._instrument",
                                          "attnscope._api", "attnscope._runtime",
                                          "opentelemetry.sdk"))


def test_log_is_a_leaf() -> None:
    # Every module logs: _log importing any of ours would load that module everywhere.
    assert sorted(i for i in RAW["attnscope._log"] if i.startswith("attnscope")) == []


def test_the_trigger_files_are_a_leaf() -> None:
    # `attnscope trigger` writes them and the worker reads them: importing anything of ours
    # would load that side into the command (or the command's readers into the worker).
    assert sorted(i for i in RAW["attnscope._trigger_files"] if i.startswith("attnscope")) == []


def test_the_runtime_imports_neither_side() -> None:
    # Both sides import the runtime: it holds their state, never their code (nor OpenTelemetry).
    assert not _bad_imports(("_runtime",), ("attnscope._capture", "attnscope._worker",
                                            "attnscope._export", "attnscope._instrument",
                                            "attnscope._api", "opentelemetry"))


@pytest.mark.parametrize(("module", "absent"), [
    ("attnscope._derive.call", ("attnscope._capture",)),
    ("attnscope._record.capture", ("attnscope._capture", "attnscope._worker")),
    ("attnscope._record.reduce", ("attnscope._capture", "attnscope._worker")),
    ("attnscope.cli.trigger", ("attnscope._capture", "opentelemetry")),
])
def test_a_module_loads_no_layer_above_it(module: str, absent: tuple[str, ...]) -> None:
    # Transitively, at run time: what importing the module really loads, lazy imports aside.
    code = (f"import sys, {module}; "
            f"print(sorted(m for m in sys.modules if m.startswith({absent!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stdout + done.stderr[-2000:]


def test_attention_math_imports_neither_side_nor_threads_nor_opentelemetry() -> None:
    # _attention/ is pure arithmetic over a call's facts (FLOPs, masks, bytes, the families'
    # detectors and rules): both the worker and instrument() import it, it imports record/ only.
    assert not _bad_imports(("_attention",), ("attnscope._capture", "attnscope._worker",
                                             "attnscope._export", "attnscope._instrument",
                                             "attnscope._api", "attnscope._runtime",
                                             "attnscope._log", "opentelemetry", "threading"))


def test_the_layering_checks_catch_a_crossing() -> None:
    RAW["attnscope._worker._probe"] = {"attnscope._capture.wrapper"}
    RAW["attnscope._capture._probe"] = {"attnscope._worker.loop"}
    try:
        assert _bad_imports(("_worker",), ("attnscope._capture",)) == {
            "attnscope._worker._probe": ["attnscope._capture.wrapper"]}
        assert "attnscope._capture._probe" in _bad_imports(("_capture",), ("attnscope._worker",))
    finally:
        del RAW["attnscope._worker._probe"], RAW["attnscope._capture._probe"]


def test_no_import_cycles() -> None:
    # Package __init__ edges to their own children are how Python loads packages, not cycles.
    graph = {name: {i for i in deps if not i.startswith(name + ".")}
             for name, deps in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_files_and_functions_stay_small() -> None:
    for name, path in MODULES.items():
        source = path.read_text()
        code = _code_lines(source)
        assert len(code) <= MAX_FILE_LINES, f"{name} has {len(code)} lines of code"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
                length = len(code.intersection(span))
                assert length <= MAX_FUNCTION_LINES, f"{name}.{node.name}: {length} lines of code"


def test_line_counts_leave_out_docstrings_and_comments() -> None:
    source = ('def f() -> int:\n    """Doc.\n\n    More.\n    """\n    # why\n\n'
              '    return (1 +\n            2)\n')
    assert sorted(_code_lines(source)) == [1, 8, 9]


def _code_lines(source: str) -> set[int]:
    """Line numbers that hold code: not blank, not only a comment, not a docstring."""
    tree = ast.parse(source)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        code.update(range(tok.start[0], tok.end[0] + 1))
    return code - docstrings


_MUTABLE = (dict, list, set, deque, weakref.WeakSet, weakref.WeakKeyDictionary,
            weakref.WeakValueDictionary, type(threading.Lock()), type(threading.RLock()))


def test_process_state_lives_in_the_runtime_only() -> None:
    """No module keeps a mutable global or rebinds one with ``global``; the only objects with a
    ``reset()`` and an ``after_fork()`` at module level are the runtime and the logger's limits
    (the leaf ``_log`` owns them; the runtime resets them)."""
    owned = {id(runtime), id(_log.limits)}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            assert not isinstance(node, ast.Global), f"{name} rebinds a module global"
        if name.endswith("__main__"):
            continue  # running it is the command line
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.startswith("__") or attr.isupper() or attr.lstrip("_").isupper():
                continue  # constants: UPPER_CASE by convention, never mutated
            assert not isinstance(value, _MUTABLE), f"{name}.{attr} is mutable process state"
            if not isinstance(value, type) and hasattr(value, "after_fork"):
                assert id(value) in owned, f"{name}.{attr} is process state outside the runtime"


def _locks(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(obj).items()
            if isinstance(v, (type(threading.Lock()), type(threading.RLock())))}


def test_after_fork_makes_every_lock_new() -> None:
    # every component that keeps its object across a fork (grants and delivery are new objects)
    holders = [runtime.config, runtime.span_sites, runtime.retention, runtime.worker,
               runtime.metrics, runtime.instrumentation, runtime.graphs, runtime.log,
               runtime.profiler,
               runtime.sampler, runtime.sampler.bucket, runtime.sampler.budget]
    before = [_locks(h) for h in holders]
    assert all(before)
    runtime.after_fork()
    for holder, old in zip(holders, before, strict=True):
        new = _locks(holder)
        assert set(new) == set(old)
        assert all(new[k] is not old[k] for k in old), type(holder).__name__


def test_counters_are_exact_under_eight_threads() -> None:
    from attnscope.testing import capture_spans

    @attnscope.trace
    def f(x: int) -> int:
        return x

    threads, calls = 8, 500
    barrier = threading.Barrier(threads)

    def run() -> None:
        barrier.wait()
        for i in range(calls):
            f(i)

    with capture_spans(queue_size=threads * calls):
        sampled_before = attnscope.stats()["sampled"]
        pool = [threading.Thread(target=run) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert attnscope.flush(timeout_s=30)
        stats = attnscope.stats()
    assert stats["sampled"] - sampled_before == threads * calls
    assert stats["captured"] == stats["emitted"] == threads * calls


def test_overhead_budget_adds_are_exact_under_eight_threads() -> None:
    budget = OverheadBudget(0.5, window_s=1e9)  # the window never closes: sums stay readable
    barrier = threading.Barrier(8)

    def run() -> None:
        barrier.wait()
        for _ in range(2000):
            budget.add(3, 7, 1.0)

    pool = [threading.Thread(target=run) for _ in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert (budget._own_ns, budget._wall_ns) == (8 * 2000 * 3, 8 * 2000 * 7)


def test_every_thread_attnscope_starts_is_named_for_it() -> None:
    # A user's thread dump, and the soak's thread check (tests/reliability/test_soak.py), tell
    # attnscope's threads from everyone else's by the name.
    unnamed, found = [], 0
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "Thread")
                    or (isinstance(node.func, ast.Name) and node.func.id == "Thread"))):
                continue
            found += 1
            given = {k.arg: k.value for k in node.keywords}.get("name")
            if not (isinstance(given, ast.Constant) and isinstance(given.value, str)
                    and given.value.startswith("attnscope-")):
                unnamed.append(f"{name}:{node.lineno}")
    assert found >= 6 and not unnamed, (found, unnamed)  # a scan that finds none proves nothing
