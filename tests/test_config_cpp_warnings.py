"""torch's C++ warnings stay off the user's stderr while attnscope profiles a call, and only
then (issue 38 §3: under `attnscope run` on CPU, "[W… CPUAllocator.cpp:245] Memory block of
unknown size was allocated before the profiling started…" reached stderr)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from attnscope._capture import profiler_session

# Blocks allocated before any session, freed one per profiled call: c10's allocator reports each
# such free while memory profiling is on (the first one, and every 1,000th, counted per process).
_PROGRAM = textwrap.dedent(
    """
    import ctypes, os, sys
    import torch
    import attnscope
    from attnscope._capture import profiler_session

    made_before = [torch.randn(256, 256) for _ in range(6)]
    attnscope.configure(sample_rate=1.0, warmup_calls=0, profile_rate=1.0,
                        profile_max_per_minute=1000.0, exporter="none", metrics=False)

    @attnscope.trace
    def attention(q):
        made_before.pop()
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    flag = profiler_session._cpp_warnings.flag
    found = isinstance(flag, ctypes.c_int32)
    before = flag.value if found else None
    q = torch.randn(1, 2, 8, 4)
    for _ in range(6):
        attention(q)
    assert attnscope.flush(timeout_s=60)
    print(attnscope.stats()["profiled"], before, flag.value if found else None)
    """
)


def _run(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("ATTNSCOPE_", "OTEL_", "TORCH_CPP_LOG_LEVEL"))}
    clean.update(OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True,
                          timeout=300, env=clean, check=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libc10.so: Linux wheels")
def test_profiled_calls_print_no_allocator_warning_and_the_level_is_put_back() -> None:
    done = _run()
    assert done.returncode == 0, done.stderr
    profiled, before, after = done.stdout.split()
    assert int(profiled) >= 1  # calls really ran under the profiler, freeing older blocks
    assert "Memory block of unknown size" not in done.stderr, done.stderr
    assert done.stderr == "", done.stderr
    assert before == after == "1"  # c10's default, WARNING: the program's own C++ warnings show


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libc10.so: Linux wheels")
def test_a_lower_level_the_user_chose_is_put_back_after_each_session() -> None:
    done = _run(TORCH_CPP_LOG_LEVEL="INFO")
    assert done.returncode == 0, done.stderr
    _, before, after = done.stdout.split()
    assert before == after == "0"
    assert "Memory block of unknown size" not in done.stderr, done.stderr


def test_hush_raises_to_error_only_and_restore_puts_back_once() -> None:
    quiet = profiler_session._CppWarnings()
    quiet.flag = ctypes.c_int32(0)
    quiet.hush()
    quiet.hush()  # a second hush (a Ctrl-C skipped a restore) keeps the first saved value
    assert quiet.flag.value == 2
    quiet.restore()
    assert (quiet.flag.value, quiet.saved) == (0, None)
    quiet.restore()  # idempotent
    assert quiet.flag.value == 0
    quiet.flag = ctypes.c_int32(3)  # the user's FATAL-only: never lowered
    quiet.hush()
    assert quiet.flag.value == 3
    quiet.restore()
    assert quiet.flag.value == 3
    missing = profiler_session._CppWarnings()
    missing.flag = False  # no libc10 flag on this platform: nothing happens
    missing.hush()
    missing.restore()
