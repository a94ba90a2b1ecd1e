"""``attnscope diff --help`` loads no statistics library (issue 38 §1): ``scipy.stats`` took
6-8 s to import on a loaded machine and was pulled in by the diff command's modules at import
time; the command's work (numpy, rich) is imported only when it runs. Checked on the modules a
fresh interpreter has loaded, never on time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

# Libraries the diff command must not load before it computes something.
_HEAVY = ("scipy", "torch", "matplotlib", "numpy", "rich", "attnscope.cli.diff._command")


def _loaded_after(code: str) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which of ``_HEAVY`` it then has in sys.modules."""
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        sys.__stdout__.write("\\n" + json.dumps({{m: m in sys.modules for m in {_HEAVY!r}}}))
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded: dict[str, bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_diff_help_loads_no_scipy_numpy_or_the_commands_work() -> None:
    loaded = _loaded_after("""
        import contextlib, io
        from attnscope.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            try:
                main(["diff", "--help"])
            except SystemExit as stop:
                assert stop.code == 0, stop.code
        assert "--fail-if-slower" in out.getvalue()
    """)
    assert loaded == dict.fromkeys(_HEAVY, False), loaded


def test_importing_every_diff_module_loads_no_scipy() -> None:
    loaded = _loaded_after("""
        import attnscope.cli.diff, attnscope.cli.diff._stats, attnscope.cli.diff._runs
        import attnscope.cli.diff._groups, attnscope.cli.diff._diary, attnscope.cli.diff._json
        import attnscope.cli.diff._text
    """)
    assert not loaded["scipy"] and not loaded["torch"], loaded


def test_a_one_run_interval_does_load_scipy() -> None:
    """The control: the probe sees scipy when the one-run bootstrap (scipy's) is computed."""
    loaded = _loaded_after("""
        from attnscope.cli.diff._stats import METRICS, compare
        [p50] = compare([1.0 + i / 100 for i in range(40)], [2.0 + i / 100 for i in range(40)],
                        METRICS[:1], resamples=50)
        assert p50.low > 0.5, p50
    """)
    assert loaded["scipy"], loaded
