"""What the command line imports: the commands that run no model (and the --help of those that
do) start without torch (the console script imports ``attnscope.cli``, which imports neither torch
nor the library), and a missing ``[cli]`` extra is one line naming it, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import attnscope

ROOT = Path(__file__).resolve().parent.parent

# What the `attnscope` console script does (pyproject: attnscope = "attnscope.cli:main"), with an
# exit hook that reports, after the command ran, whether torch was imported.
_CONSOLE_SCRIPT = """
import atexit, sys
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
from attnscope.cli import main
sys.exit(main())
"""

# A [cli] library made unimportable (None in sys.modules: `import rich` raises
# ModuleNotFoundError, as in an install without the extra), then the console script.
_WITHOUT = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None
from attnscope.cli import main
sys.exit(main())
"""

_NEEDS_EXTRA = "attnscope: this command needs the [cli] extra: pip install 'attnscope[cli]'\n"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ATTNSCOPE_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _trace(path: Path, wall_ns: list[int]) -> Path:
    """A Jaeger JSON file of one attention layer's calls, one per time in ``wall_ns``."""
    spans = [{"traceID": f"{i:032x}", "spanID": f"{i + 1:016x}", "operationName": "attention",
              "references": [], "startTime": 1_700_000_000_000_000 + i * 1000,
              "duration": ns // 1000, "processID": "p1",
              "tags": [{"key": k, "type": t, "value": v} for k, t, v in (
                  ("attnscope.tier", "string", "timing"), ("attnscope.wall_ns", "int64", ns),
                  ("attnscope.module", "string", "model.layers.0.attn"),
                  ("attnscope.num_heads", "int64", 8), ("attnscope.head_dim", "int64", 64))]}
             for i, ns in enumerate(wall_ns)]
    doc = {"data": [{"traceID": s["traceID"], "spans": [s],
                     "processes": {"p1": {"serviceName": "svc", "tags": []}}} for s in spans]}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("startup")
    return (_trace(folder / "a.json", [1_000_000 + 1000 * i for i in range(40)]),
            _trace(folder / "b.json", [1_100_000 + 1000 * i for i in range(40)]))


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["report", "{a}"],
                                  ["diff", "{a}", "{b}"], ["trigger", "--help"],
                                  ["compare", "--help"], ["demo", "--help"]],
                         ids=["help", "version", "report", "diff", "trigger-help",
                              "compare-help", "demo-help"])
def test_commands_that_run_no_model_never_import_torch(argv: list[str],
                                                       traces: tuple[Path, Path]) -> None:
    a, b = traces
    args = [arg.format(a=a, b=b) for arg in argv]
    done = subprocess.run([sys.executable, "-c", _CONSOLE_SCRIPT, *args], capture_output=True,
                          text=True, timeout=120, env=_env(), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
    assert done.stderr.splitlines()[-1] == "torch imported: False", done.stderr[-2000:]


def test_python_dash_m_attnscope_is_the_same_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "attnscope", "--version"], capture_output=True,
                          text=True, timeout=60, env=_env(), check=False)
    assert (done.returncode, done.stdout) == (0, f"attnscope {attnscope.__version__}\n")


def test_importing_the_package_imports_no_library_until_a_name_is_used() -> None:
    code = ("import sys, attnscope; before = 'torch' in sys.modules or 'attnscope._api' in "
            "sys.modules; trace = attnscope.trace; from attnscope import span, Config; "
            "print(before, 'attnscope._api' in sys.modules, callable(trace), callable(span), "
            "sorted(set(attnscope.__all__) - set(dir(attnscope))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=_env(), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "True", "True", "[]"]


@pytest.mark.parametrize(("blocked", "argv"), [
    (["rich"], ["report", "{a}"]),
    (["matplotlib"], ["report", "{a}", "--html", "{html}"]),
    (["rich"], ["diff", "{a}", "{b}"]),
    (["scipy"], ["diff", "{a}", "{b}"]),
    (["rich"], ["compare", "--shape", "1,1,8,8", "--runs", "1"]),
    (["rich", "matplotlib", "scipy"], ["demo", "--steps", "1", "--seq-len", "8"]),
], ids=["report-rich", "report-html-matplotlib", "diff-rich", "diff-scipy", "compare-rich",
        "demo"])
def test_a_missing_cli_extra_is_one_line_naming_it(blocked: list[str], argv: list[str],
                                                   traces: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    a, b = traces
    args = [arg.format(a=a, b=b, html=tmp_path / "r.html") for arg in argv]
    done = subprocess.run([sys.executable, "-c", _WITHOUT.format(blocked=blocked), *args],
                          capture_output=True, text=True, timeout=120, env=_env(),
                          cwd=tmp_path, check=False)
    assert (done.returncode, done.stderr) == (2, _NEEDS_EXTRA), done.stderr[-2000:]
    assert not (tmp_path / "r.html").exists()
