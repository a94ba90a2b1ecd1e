"""Real SIGINTs, hundreds of them, into a loop of sampled, profiled calls (issue 35 §3).

The application catches each ``KeyboardInterrupt`` and goes on, as a server loop or a notebook
does. Afterwards no profiler session may be open, no capture current, every capture in exactly
one count, and the process must exit cleanly (it died by SIGSEGV at exit once kineto was left
on). Runs in its own interpreter, bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

_TIMEOUT_S = 300

_SCRIPT = textwrap.dedent(
    """
    import os, random, signal, threading, time
    import torch
    import attnscope
    from attnscope._runtime import runtime
    from attnscope._capture import wrapper

    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.5, profile_max_per_minute=1_000_000)
    attn = attnscope.trace(name="attn")(
        lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
    # nested: the inner calls' parent is the outer's capture
    outer = attnscope.trace(name="outer")(lambda q: (attn(q), attn(q)))
    q = torch.ones(1, 2, 8, 16)
    for _ in range(5):
        attn(q)  # warm
    attnscope.flush(timeout_s=30)

    SIGNALS = 400
    main = threading.main_thread().ident
    done = threading.Event()

    def storm():
        rng = random.Random(35)
        for _ in range(SIGNALS):
            time.sleep(rng.uniform(0.0005, 0.004))
            signal.pthread_kill(main, signal.SIGINT)
        done.set()

    # The application's Ctrl-C lands anywhere inside the traced call (attnscope's code, torch's,
    # the worker hand-over); the loop's own lines are the application's, not under test.
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=storm, daemon=True).start()
    interrupted = calls = 0
    while not done.is_set():
        try:
            inside[0] = True
            outer(q)
            inside[0] = False
            calls += 1
        except KeyboardInterrupt:
            inside[0] = False
            interrupted += 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    p = runtime.profiler
    assert p.active is None and not p.session_lock.locked(), "session left open"
    assert not torch._C._autograd._profiler_enabled(), "kineto left on"
    assert wrapper.current.get() is None, "a capture left current"
    assert attnscope.flush(timeout_s=60), attnscope.stats()
    s = attnscope.stats()
    accounted = (s["emitted"] + s["dropped_queue_full"] + s["dropped_trace_cap"]
                 + s["worker_errors"] + s["pending"])
    assert s["captured"] == accounted and s["pending"] == 0, s
    assert s["profiled"] > 0, s
    print("interrupted", interrupted, "calls", calls, "captured", s["captured"], flush=True)
    """
)


def test_a_storm_of_sigints_leaves_nothing_open_and_no_count_wrong() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"hung: {out[-500:]!r} {err[-2000:]!r}") from None
    assert proc.returncode == 0, (proc.returncode, err[-3000:])  # -11: SIGSEGV at exit
    words = out.split()
    assert words[:1] == ["interrupted"] and int(words[1]) > 50, out
