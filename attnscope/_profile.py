"""torch.profiler around one sampled call (profile tier).

The calling thread only starts and stops a kineto session (:func:`start`, :func:`stop`); the
worker parses it (:func:`finish`, via :mod:`attnscope._kernels`). Sessions use torch's profiler
entry points directly (``torch._C._autograd._prepare_profiler`` / ``_enable_profiler`` /
``_disable_profiler``, what ``torch.profiler.profile`` runs underneath) so that no call pays for
``torch.profiler.profile``'s first-use import of Dynamo/Inductor (about a second).

Only one profiler may run in a process, and a second kineto session crashes it. So:

- attnscope runs at most one session at a time (a process-wide lock, never waited for on the
  calling thread: a busy lock means this call is timed instead);
- a user's profiler is recognised by torch's own flags and, from attnscope's import on, by thin
  counting wrappers around ``torch.autograd.profiler``'s ``_prepare_profiler`` /
  ``_enable_profiler`` / ``_disable_profiler`` (a schedule's wait/warm-up phase has prepared
  kineto without setting any flag, and a second session then crashes the process). While one
  is prepared or running, profile-tier
  calls are timed instead; a user's profiler that starts while attnscope's session runs on another
  thread waits for that one call to end (at most ``_USER_WAIT_S``); one started inside a traced
  call on the same thread ends attnscope's session first. Every skip is counted (:func:`stats`)
  and logged once per reason.
- The first kineto session of a process (and CUPTI's start-up on a GPU) is slow; it is paid by
  :func:`warm_up` on the worker thread or a helper thread, never by a user's call. Until the
  profiler is warm, profile-tier calls are timed (reason ``warming``).
"""

from __future__ import annotations

import functools
import gc
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from . import _config, _kernels, _safety

__all__ = ["start", "stop", "finish", "warm_up", "warm_up_async", "on_worker_start", "is_warm",
           "install_hooks", "stats", "Session"]

MARKER = "attnscope"
_USER_WAIT_S = 5.0
_SKIP_REASONS = ("warming", "user_profiler", "busy", "sync_debug", "error")

_lock = threading.Lock()  # held for the whole of one attnscope session
_state = threading.Lock()  # counters, warm-up thread
_owner: int | None = None  # thread ident of the running session
_active: Session | None = None
_foreign = False  # a user's profiler is prepared or running (seen through the hooks)
_hooked = False
_warm_cpu = False
_warm_cuda = False
_broken: dict[bool, str] = {}  # on_cuda -> why kineto refused at warm-up (tier off for those calls)
_warming: threading.Thread | None = None
_counts: dict[str, int] = {"profiled": 0, **{"skipped_" + r: 0 for r in _SKIP_REASONS}}
_logged: set[str] = set()
_torch: Any = None
_orig: dict[str, Callable[..., Any]] = {}
_configs: dict[bool, tuple[Any, Any]] = {}


class Session:
    """One running (then finished) profiler session; filled on the calling thread."""

    __slots__ = ("result", "marker", "device", "on_cuda", "aborted")

    def __init__(self, device: Any, on_cuda: bool) -> None:
        self.result: Any = None  # torch's _ProfilerResult once stopped
        self.marker: Any = None
        self.device = device
        self.on_cuda = on_cuda
        self.aborted = False


# ---- calling thread --------------------------------------------------------------------------

def start(device: Any) -> Session | None:
    """Start a profiler session for one call, or return None to fall back to timing."""
    global _owner, _active
    on_cuda = getattr(device, "type", None) == "cuda"
    if on_cuda in _broken:
        _skip("error")
        return None
    if not (_warm_cuda if on_cuda else _warm_cpu):
        _skip("warming")
        warm_up_async(cuda=on_cuda)
        return None
    if _foreign or _user_profiler_active():
        _skip("user_profiler")
        return None
    if on_cuda and _sync_debug_on():
        _skip("sync_debug")  # stopping CUPTI needs a stream sync, which the user asked to flag
        return None
    if not _lock.acquire(blocking=False):
        _skip("busy")
        return None
    if _foreign:  # a user's profiler claimed it between the check and the lock
        _lock.release()
        _skip("user_profiler")
        return None
    session = Session(device, on_cuda)
    try:
        config, activities = _configs[on_cuda]
        _owner = threading.get_ident()
        _active = session
        _orig["prepare"](config, activities)
        _orig["enable"](config, activities)
        session.marker = _torch.ops.profiler._record_function_enter_new(MARKER, None)
    except Exception as exc:
        _release(disable=True)
        _skip("error", exc)
        return None
    return session


def stop(session: Session) -> None:
    """Stop the session started by :func:`start` (calling thread; parsing is the worker's)."""
    if session.aborted or _active is not session:
        return
    try:
        if session.marker is not None:
            _torch.ops.profiler._record_function_exit._RecordFunction(session.marker)
            session.marker = None
        if session.on_cuda:
            # Kernels still queued when CUPTI stops are never reported: wait for this stream's
            # work, as torch.profiler waits for the device. The one host wait attnscope makes,
            # on profile-tier calls only (profile_max_per_minute); the timing tier never waits.
            _torch.cuda.current_stream(session.device).synchronize()
        session.result = _orig["disable"]()
        with _state:
            _counts["profiled"] += 1
    except Exception as exc:
        session.result = None
        _release(disable=True)
        _safety.internal_error("profile-stop", exc)
        return
    _release(disable=False)


def _release(disable: bool) -> None:
    global _owner, _active
    if disable:
        try:
            if _torch is not None and _torch._C._autograd._profiler_enabled():
                _orig["disable"]()
        except Exception:
            pass
    _owner = None
    _active = None
    _lock.release()


def _user_profiler_active() -> bool:
    try:
        return bool(_torch.autograd.profiler._is_profiler_enabled
                    or _torch._C._autograd._profiler_enabled())
    except Exception:
        return True


def _sync_debug_on() -> bool:
    try:
        return bool(_torch.cuda.get_sync_debug_mode())
    except Exception:
        return False


def _skip(reason: str, exc: BaseException | None = None) -> None:
    with _state:
        _counts["skipped_" + reason] += 1
        first = reason not in _logged
        _logged.add(reason)
    if exc is not None:
        _safety.internal_error("profile-start", exc)
    if first:
        _safety.warn_once("profile-skip:" + reason,
                          "attnscope: a profile-tier call was timed instead (counted in "
                          "attnscope's profile stats; logged once per reason)", reason=reason)


def stats() -> dict[str, int]:
    """Profiled sessions and profile-tier calls that were timed instead, by reason."""
    with _state:
        return dict(_counts)


# ---- worker thread ---------------------------------------------------------------------------

def finish(cap: Any) -> tuple[dict[str, Any], list[Any]]:
    """Worker side: parse a finished session into span attributes and kernel child spans."""
    session: Session = cap.profile
    result, session.result = session.result, None
    if result is None:  # aborted for a user's profiler, or stopping failed: nothing was measured
        return {"tier": "timing"}, []
    cfg = _config.current()
    try:
        events = _kernels.from_kineto(result, MARKER)
        report = _kernels.analyze(events, span_start_ns=cap.start_epoch_ns,
                                  span_end_ns=cap.end_epoch_ns, max_spans=cfg.max_kernel_spans,
                                  on_device=session.on_cuda)
    except Exception as exc:  # the span still goes out, without kernel data
        _safety.internal_error("profile-parse", exc)
        return {"tier": "timing"}, []
    attrs = report.attributes
    if cfg.profile_dir:
        try:
            attrs["profile.path"] = _save(result, cfg.profile_dir, cap)
        except Exception as exc:
            _safety.internal_error("profile-save", exc)
    return attrs, report.children


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _save(result: Any, directory: str, cap: Any) -> str:
    os.makedirs(directory, exist_ok=True)
    name = _UNSAFE.sub("_", cap.name)[:64] or "call"
    path = os.path.abspath(os.path.join(directory, f"{name}-{os.getpid()}-{cap.capture_id}.pt.trace.json"))
    result.save(path)
    return path


# ---- warm-up and the user's profiler ---------------------------------------------------------

def is_warm(cuda: bool = False) -> bool:
    return _warm_cuda if cuda else _warm_cpu


def on_worker_start() -> None:
    """Worker thread: warm the profiler up when the configuration can ask for the profile tier."""
    try:
        cfg = _config.current()
        if cfg.enabled and cfg.profile_rate > 0 and cfg.profile_max_per_minute > 0:
            warm_up()
    except Exception as exc:
        _safety.internal_error("profile-warmup", exc)


def warm_up_async(cuda: bool | None = None) -> None:
    """Warm the profiler up on a helper thread (at most one at a time). Never raises."""
    global _warming
    try:
        with _state:
            if _warming is not None and _warming.is_alive():
                return
            thread = threading.Thread(target=warm_up, args=(cuda,), daemon=True,
                                      name="attnscope-profiler-warmup")
            _warming = thread
        thread.start()
    except Exception as exc:
        _safety.internal_error("profile-warmup", exc)


def warm_up(cuda: bool | None = None) -> bool:
    """Pay the profiler's first-use costs on this thread (not a user's). True when warm.

    ``cuda=None`` includes CUDA activity only when CUDA is already initialised (warming CUPTI
    must not create a CUDA context the program did not ask for). Never raises.
    """
    global _warm_cpu, _warm_cuda, _owner
    try:
        if not _load():
            return False
        if cuda is None:
            cuda = bool(_torch.cuda.is_available() and _torch.cuda.is_initialized())
        if cuda and True in _broken:
            cuda = False  # CUPTI refused once: keep the CPU side warm only
        if _warm_cpu and (_warm_cuda or not cuda):
            return True
        if _foreign or _user_profiler_active() or not _lock.acquire(blocking=False):
            return False
    except Exception as exc:
        _safety.internal_error("profile-warmup", exc)
        return False
    try:
        if _foreign:
            return False
        _owner = threading.get_ident()
        config, activities = _configs[bool(cuda)]
        _orig["prepare"](config, activities)
        _orig["enable"](config, activities)
        handle = _torch.ops.profiler._record_function_enter_new(MARKER, None)
        _torch.ops.profiler._record_function_exit._RecordFunction(handle)
        result = _orig["disable"]()
        result.events()
        _warm_cpu = True
        if cuda:
            _warm_cuda = True
        return True
    except Exception as exc:
        _broken[bool(cuda)] = repr(exc)
        _safety.internal_error("profile-warmup", exc)
        try:
            if _torch._C._autograd._profiler_enabled():
                _orig["disable"]()
        except Exception:
            pass
        return False
    finally:
        _owner = None
        _lock.release()


def _load() -> bool:
    """Import torch's profiler pieces, build the configs, install the hooks (once)."""
    global _torch
    if _torch is not None:
        return True
    # Kineto prints two "USDT ... profiler_start/stop" lines per session at its default level;
    # a service profiling a few calls a minute should not fill its logs with them. Read at
    # kineto's first use; a value the user set is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    import torch
    from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler
    from torch._C._profiler import (
        ProfilerActivity,
        ProfilerConfig,
        ProfilerState,
        _ExperimentalConfig,
    )

    for on_cuda in (False, True):
        config = ProfilerConfig(ProfilerState.KINETO, True, True, False, False, False,
                                _ExperimentalConfig())
        activities = {ProfilerActivity.CPU}
        if on_cuda:
            activities.add(ProfilerActivity.CUDA)
        _configs[on_cuda] = (config, activities)
    _orig.update(prepare=_prepare_profiler, enable=_enable_profiler, disable=_disable_profiler)
    install_hooks()
    _torch = torch
    return True


def install_hooks() -> None:
    """Count the user's profiler sessions: wrap the three entry points torch.profiler calls.

    Runs at import (attnscope imports torch anyway): patching costs microseconds. A session that
    predates it is looked for only when torch's own flags say there may be one. Never raises.
    """
    global _hooked, _foreign
    if _hooked:
        return
    try:
        import torch.autograd.profiler as module

        for attr, hook in (("_prepare_profiler", _claiming), ("_enable_profiler", _claiming),
                           ("_disable_profiler", _releasing)):
            current = getattr(module, attr, None)
            if current is None or getattr(current, "__attnscope_hook__", False):
                continue
            wrapped = hook(current)
            wrapped.__attnscope_hook__ = True  # type: ignore[attr-defined]
            setattr(module, attr, wrapped)
        _hooked = True
        if _maybe_open(module) and _open_session_exists(module.profile):
            _foreign = True  # cleared by that session's own _disable_profiler call
    except Exception as exc:
        _safety.internal_error("profile-hooks", exc)


def _maybe_open(module: Any) -> bool:
    """A user's profiler may already be prepared: torch.profiler.profile registers its step
    counter when built and drops it on exit; a running session sets the enabled flag."""
    tracker = getattr(module, "KinetoStepTracker", None)
    steps = getattr(tracker, "_step_dict", {}) if tracker is not None else {}
    return bool(getattr(module, "_is_profiler_enabled", False)) or "ProfilerStep" in steps


def _open_session_exists(profile_cls: type) -> bool:
    """Some profile object has been prepared (entered) and not stopped yet (rare path: a scan)."""
    try:
        return any(type(obj) is profile_cls and getattr(obj, "entered", False)
                   and getattr(obj, "kineto_results", None) is None
                   for obj in gc.get_referrers(profile_cls))
    except Exception:
        return True  # cannot tell: stay out of the way


def _claiming(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def claim(*args: Any, **kwargs: Any) -> Any:
        _claim_for_user()
        return fn(*args, **kwargs)

    return claim


def _releasing(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def release(*args: Any, **kwargs: Any) -> Any:
        global _foreign
        try:
            return fn(*args, **kwargs)
        finally:
            _foreign = False

    return release


def _claim_for_user() -> None:
    """A user's profiler is starting: make room for it, then keep attnscope's sessions out."""
    global _foreign
    try:
        session = _active
        if session is not None and _owner == threading.get_ident():
            # Started inside a traced call on this thread: end attnscope's session first
            # (claimed before the lock is let go, so no other thread starts one meanwhile).
            _foreign = True
            session.aborted = True
            _release(disable=True)
            _skip("user_profiler")
        elif _lock.acquire(timeout=_USER_WAIT_S):
            _foreign = True  # set under the lock: a session starting now sees it and backs off
            _lock.release()
        else:
            _foreign = True
            _safety.warn_once("profile-user-wait", "attnscope: profiler lock not released in time")
    except Exception as exc:
        _safety.internal_error("profile-hook", exc)


def _after_fork_in_child() -> None:
    # A session running in another thread of the parent does not exist in the child.
    global _lock, _state, _owner, _active, _warming
    _lock = threading.Lock()
    _state = threading.Lock()
    _owner = None
    _active = None
    _warming = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
install_hooks()
