"""torch.profiler around one sampled call (profile tier).

The calling thread only starts and stops a kineto session (:func:`start`, :func:`stop`); the
worker parses it (:mod:`attnscope._worker.kernels`). Sessions use torch's profiler
entry points directly (``torch._C._autograd._prepare_profiler`` / ``_enable_profiler`` /
``_disable_profiler``, what ``torch.profiler.profile`` runs underneath) so that no call pays for
``torch.profiler.profile``'s first-use import of Dynamo/Inductor (about a second).

Only one profiler may run in a process, and a second kineto session crashes it. So:

- attnscope runs at most one session at a time (a process-wide lock, never waited for on the
  calling thread: a busy lock means this call is timed instead);
- a user's profiler is recognised by torch's flags and by counting wrappers around
  ``torch.autograd.profiler``'s ``_prepare_profiler`` / ``_enable_profiler`` /
  ``_disable_profiler`` (a schedule's warm-up has prepared kineto without setting any flag).
  While one is prepared or running, profile-tier calls are timed instead; one that starts while
  attnscope profiles a call on another thread waits for that call to end
  (:func:`_wait_for_session`); one started inside a traced call on the same thread ends
  attnscope's session first. Every skip is counted (:func:`stats`) and logged at DEBUG.
- The first kineto session of a process (and CUPTI's start-up on a GPU) is slow; it is paid by
  :func:`warm_up` on the worker thread or a helper thread, never by a user's call. Until the
  profiler is warm, profile-tier calls are timed (reason ``warming``).
- Without CUDA, the first session runs on the main thread instead, at import or ``configure()``
  (:func:`warm_up_on_main_thread`, about 2 ms): libkineto prints "ERROR: External init callback
  must run in same thread as registerClient" to stderr when its first session runs on another
  thread than the one that loaded torch.
- While a session of attnscope's runs, c10's C++ log threshold is ERROR (:class:`_CppWarnings`):
  memory profiling makes c10's CPU allocator print "Memory block of unknown size was allocated
  before the profiling started" when a block made before the session is freed during it, which
  nearly every profiled call does; attnscope's sessions must not print on the user's stderr.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _interrupt_safe, _log
from .._record.capture import PROFILE_MARKER, Capture, ProfileSession
from .._runtime import runtime
from . import fork_exit, inner_sdpa  # noqa: F401  (fork_exit: a forked child exits without kineto)

if TYPE_CHECKING:
    from .._config import Config

__all__ = ["start", "stop", "warm_up", "warm_up_async", "warm_up_on_main_thread",
           "on_worker_start", "install_hooks", "stats", "profile_tier_on"]

_USER_WAIT_S = 5.0
_WARMING_WAIT_S = 60.0  # a warm-up under way, awaited by warm_up(): CUPTI took 4.5 s on an H200
_USER_WAIT_MAX_S = 300.0
_C10_ERROR = 2  # c10's (glog's) severities: 0 INFO, 1 WARNING, 2 ERROR


class _CppWarnings:
    """c10's C++ log threshold (``FLAGS_caffe2_log_level``, what ``TORCH_CPP_LOG_LEVEL`` sets at
    start-up), raised to ERROR for the span of attnscope's own profiler sessions and put back
    after, never lowered. Sessions never overlap (the session lock), so one saved value.

    Found through ctypes in the libc10 torch already loaded; where it cannot be (another platform
    or build), sessions leave the level alone. ``hush`` after ``hush`` keeps the first saved
    value, and ``restore`` is idempotent: a Ctrl-C between them leaves the user's level at most
    until the next session ends.
    """

    def __init__(self) -> None:
        self.flag: Any = None  # a ctypes.c_int32 in libc10, False: not available
        self.saved: int | None = None

    def find(self, torch: Any) -> None:
        """Look the flag up (set-up time, once). Never raises."""
        if self.flag is not None:
            return
        self.flag = False
        try:
            import ctypes
            import sys

            name = {"linux": "libc10.so", "darwin": "libc10.dylib"}.get(sys.platform)
            if name is None:
                return
            path = os.path.join(os.path.dirname(torch.__file__), "lib", name)
            # RTLD_NOLOAD: the library torch loaded, or nothing (never a second copy)
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | getattr(os, "RTLD_LAZY", 1))
            self.flag = ctypes.c_int32.in_dll(lib, "FLAGS_caffe2_log_level")
        except Exception:  # noqa: BLE001  (no flag: sessions print what torch prints)
            self.flag = False

    def hush(self) -> None:
        flag = self.flag
        if flag is None or flag is False:  # not `not flag`: a c_int32 of 0 (INFO) is falsy
            return
        if self.saved is None:
            self.saved = flag.value
        if flag.value < _C10_ERROR:
            flag.value = _C10_ERROR

    def restore(self) -> None:
        saved = self.saved
        if saved is not None and self.flag is not None and self.flag is not False:
            self.flag.value = saved
        self.saved = None


_cpp_warnings = _CppWarnings()

# ---- calling thread --------------------------------------------------------------------------

def start(cap: Capture, device: Any) -> bool:
    """Start a profiler session for one call, as ``cap.profile``; False: time the call instead."""
    p = runtime.profiler
    on_cuda = getattr(device, "type", None) == "cuda"
    if on_cuda in p.broken:
        _skip("error")
        return False
    if not (p.warm_cuda if on_cuda else p.warm_cpu):
        _skip("warming")
        warm_up_async(cuda=on_cuda)
        return False
    if p.active is not None and p.owner == threading.get_ident() and _orphaned(p.active):
        _close_orphan(p.active)
    if p.foreign or _user_profiler_active():
        _skip(_whose_profiler(p))
        return False
    if on_cuda and _sync_debug_on():
        _skip("sync_debug")  # stopping CUPTI needs a stream sync, which the user asked to flag
        return False
    # Filled from C (_interrupt_safe): a Ctrl-C handled as a call returns cannot lose whether
    # the lock was taken, as `held = ...` could before it stored the result.
    held: list[bool] = []
    session = ProfileSession(device, on_cuda, cap)
    started = False
    try:  # the lock is taken inside: a Ctrl-C on any line leaves it held only by a session
        _interrupt_safe.take(p.session_lock, held)
        if True not in held:
            _skip("busy")
            return False
        if p.foreign:  # a user's profiler claimed it between the check and the lock
            _skip("user_profiler")
            return False
        # stored before anything starts: whoever gives the capture up stops what runs
        cap.profile = session
        config, activities = p.configs[on_cuda]
        p.owner = threading.get_ident()
        p.active = session
        _cpp_warnings.hush()  # put back by _close, on every path out of the session
        _interrupt_safe.call_into(session.prepared, p.entry_points["prepare"], config,
                                  activities)
        # one line, no call before enable's: a Ctrl-C lands before both or after enable ran
        session.enabling = True; p.entry_points["enable"](config, activities)  # noqa: E702
        session.marker = p.torch.ops.profiler._record_function_enter_new(
            PROFILE_MARKER, None)
        started = True  # from here on the capture's leave() stops it
        return True
    except Exception as exc:
        _skip("error", exc)
        return False
    finally:  # Ctrl-C included: never leave the lock held or kineto on without a session
        if True in held and not started:
            cap.profile = None
            interrupt = _interrupt_safe.settle(_close, session)
            if interrupt is not None:
                raise interrupt


def stop(session: ProfileSession) -> None:
    """Stop the session started by :func:`start` (calling thread; parsing is the worker's)."""
    if session.aborted or session.released:
        return
    # every step once, again after a Ctrl-C that lands in it; that Ctrl-C is raised after
    interrupt = _interrupt_safe.settle(_stop, session)
    if interrupt is not None:
        raise interrupt


def _stop(session: ProfileSession) -> None:
    """One run of :func:`stop`'s steps; each step done already is skipped."""
    p = runtime.profiler
    if session.released:
        return
    if p.active is session and p.owner != threading.get_ident():  # (not yet half-closed)
        # kineto's state is the starting thread's, and only that thread can stop it. Letting the
        # lock go would let a second session start beside this one (which crashes the process):
        # it stays open for its thread's next profiled call to close (the main thread's: exit).
        _log.internal_error("profile-stop", RuntimeError(
            "a profiler session was stopped on another thread than the one that started it"))
        return
    try:
        if not session.stopped:
            if session.marker is not None:  # ending it twice is a no-op
                p.torch.ops.profiler._record_function_exit._RecordFunction(session.marker)
                session.marker = None
            if session.on_cuda and not session.synced:
                # Kernels still queued when CUPTI stops are never reported: wait for this
                # stream's work, as torch.profiler waits for the device. The one host wait
                # attnscope makes, on profile-tier calls only (profile_max_per_minute); the
                # timing tier never waits.
                p.torch.cuda.current_stream(session.device).synchronize()
                session.synced = True
            if p.torch._C._autograd._profiler_enabled():
                _interrupt_safe.call_into(session.stopped, p.entry_points["disable"])
        if session.stopped and not session.counted:
            with p.lock:  # one line, no call: counted once
                session.counted = True; p.counts["profiled"] += 1  # noqa: E702
    except Exception as exc:
        _log.internal_error("profile-stop", exc)
    _close(session)


def _close(session: ProfileSession) -> None:
    """End what ``session`` started, once each: the SDPA recorder, kineto (finishing a session
    only prepared), c10's log level; last, the lock. Safe to run again from any line."""
    p = runtime.profiler
    if session.released:
        return
    try:
        inner_sdpa.disarm()  # a profiled layer's SDPA recorder (capture.inner_sdpa)
    except Exception as exc:
        _log.internal_error("inner-sdpa", exc)
    try:
        enabled = p.torch._C._autograd._profiler_enabled
        # a session only prepared makes the next prepare print torch's "disableProfiler called
        # but no active profiling session": enable it, to disable it below
        if session.prepared and not session.enabling:
            session.enabling = True; p.entry_points["enable"](*p.configs[session.on_cuda])  # noqa: E702
        if session.enabling and enabled():
            p.entry_points["disable"]()
    except Exception as exc:
        _log.internal_error("profile-stop", exc)
    _cpp_warnings.restore()  # after kineto stopped: no block freed from now on is reported
    session.capture = None  # no cycle with the capture (its profile held until a gc pass)
    if p.active is session:
        p.owner = p.active = None
    # One line, no call before the release: a Ctrl-C lands before it (the next run does it) or
    # after the release (the next run returns above); never releases twice.
    session.released = True; p.session_lock.release()  # noqa: E702


def _orphaned(session: ProfileSession) -> bool:
    """A session of this thread's whose call has ended: Ctrl-Cs landed in each clean-up that
    would have closed it (the next profile-tier call on the thread closes it)."""
    cap = session.capture
    return cap is None or cap.end_perf_ns != 0 or cap.profile is not session


def _close_orphan(session: ProfileSession) -> None:
    """Close an orphaned session (its call's span went out timed, without a profile)."""
    _log.debug_once("profile-orphan", "attnscope: closed a profiler session that Ctrl-Cs had "
                    "left open")
    session.counted = True  # no profiled call: stats()' "profiled" counts profiles, not sessions
    interrupt = _interrupt_safe.settle(_stop, session)
    if interrupt is not None:
        raise interrupt


def _close_at_exit() -> None:
    """The main thread's session, if Ctrl-Cs left it open to the end: closed (kineto left on
    crashes the process as it exits). Never raises."""
    try:
        p = runtime.profiler
        session = p.active
        if session is not None and p.owner == threading.main_thread().ident:
            _interrupt_safe.settle(_stop, session)
    except BaseException:  # noqa: BLE001  (exit goes on)
        pass


def _user_profiler_active() -> bool:
    p = runtime.profiler
    try:
        return bool(p.torch.autograd.profiler._is_profiler_enabled
                    or p.torch._C._autograd._profiler_enabled())
    except Exception:
        return True


def _whose_profiler(p: Any) -> str:
    """Why a running profiler keeps this call out (skip branch only): attnscope's own session,
    this thread's (a traced call inside a profiled one: ``nested``, its ops are in that call's
    profile) or another thread's (``busy``); else the user's."""
    owner = p.owner
    if p.foreign or owner is None:
        return "user_profiler"
    return "nested" if owner == threading.get_ident() else "busy"


def _sync_debug_on() -> bool:
    try:
        return bool(runtime.profiler.torch.cuda.get_sync_debug_mode())
    except Exception:
        return False


def _skip(reason: str, exc: BaseException | None = None) -> None:
    p = runtime.profiler
    with p.lock:
        p.counts["skipped_" + reason] += 1
    if exc is not None:
        _log.internal_error("profile-start", exc)
    _log.debug_once("profile-skip:" + reason, "attnscope: a profile-tier call was timed instead "
                    "(counted in attnscope.stats())", reason=reason)


def stats() -> dict[str, int]:
    """Profiled sessions and profile-tier calls that were timed instead, by reason."""
    p = runtime.profiler
    with p.lock:
        return dict(p.counts)


# ---- warm-up and the user's profiler ---------------------------------------------------------

def profile_tier_on(cfg: Config) -> bool:
    """Whether the configuration can ask for the profile tier (what the warm-ups wait on)."""
    return cfg.enabled and cfg.profile_rate > 0 and cfg.profile_max_per_minute > 0


def on_worker_start(cfg: Config) -> None:
    """Worker thread: warm the profiler up when the configuration can ask for the profile tier."""
    try:
        helper = runtime.profiler.warming  # set-up's, under way: the worker builds spans meanwhile
        if (helper is None or not helper.is_alive()) and profile_tier_on(cfg):
            warm_up()
    except Exception as exc:
        _log.internal_error("profile-warmup", exc)


def warm_up_on_main_thread(cfg: Config) -> None:
    """Setup (import, ``configure()``): run kineto's first session here when this is the main
    thread and there is no CUDA. Never raises.

    libkineto registers torch's client on the thread that loaded libtorch and runs its (empty)
    init callback in the first session; on another thread it prints "ERROR: External init callback
    must run in same thread as registerClient" instead. On CPU that session costs about 2 ms.
    With CUDA it stays on the worker: the first session's activities decide whether kineto ever
    traces the GPU, and CUPTI's start-up is too slow for ``import``.
    """
    p = runtime.profiler
    try:
        # once per process (under CUDA the worker's)
        if p.torch is not None or threading.current_thread() is not threading.main_thread():
            return
        if not profile_tier_on(cfg):
            return
        import torch

        if torch.cuda.is_available():
            return
        warm_up(cuda=False)
    except Exception as exc:
        _log.internal_error("profile-warmup", exc)


def warm_up_async(cuda: bool | None = None,
                  target: Callable[[bool | None], bool] | None = None) -> None:
    """Warm the profiler up on a helper thread (at most one at a time): :func:`warm_up`, or
    ``target`` (which calls it). Never raises."""
    p = runtime.profiler
    try:
        with p.lock:
            if p.warming is not None and p.warming.is_alive():
                return
            thread = threading.Thread(target=target or warm_up, args=(cuda,), daemon=True,
                                      name="attnscope-profiler-warmup")
            p.warming = thread
        thread.start()
    except Exception as exc:
        _log.internal_error("profile-warmup", exc)


def warm_up(cuda: bool | None = None) -> bool:
    """Pay the profiler's first-use costs on this thread (not a user's). True when warm.

    ``cuda=None`` includes CUDA activity only when CUDA is already initialised (warming CUPTI
    must not create a CUDA context the program did not ask for). Never raises.
    """
    p = runtime.profiler
    try:
        if not _load():
            return False
        if cuda is None:
            cuda = bool(p.torch.cuda.is_available() and p.torch.cuda.is_initialized())
        if cuda and True in p.broken:
            cuda = False  # CUPTI refused once: keep the CPU side warm only
        helper = p.warming
        if helper is not None and helper is not threading.current_thread() and helper.is_alive():
            helper.join(_WARMING_WAIT_S)  # one under way (early_warmup's): its outcome, not a no
        if p.warm_cpu and (p.warm_cuda or not cuda):
            return True
        if p.foreign or _user_profiler_active():
            return False
    except Exception as exc:
        _log.internal_error("profile-warmup", exc)
        return False
    got: list[bool] = []  # filled from C: a Ctrl-C (import on the main thread) cannot lose it
    session = ProfileSession(None, bool(cuda))  # what _close ends, as for a call's session
    try:
        _interrupt_safe.take(p.session_lock, got)
        if True not in got or p.foreign:
            return False
        p.owner = threading.get_ident()
        p.active = session
        config, activities = p.configs[bool(cuda)]
        p.kineto_ran = True
        _cpp_warnings.hush()  # the user's threads free blocks meanwhile too
        _interrupt_safe.call_into(session.prepared, p.entry_points["prepare"], config,
                                  activities)
        session.enabling = True; p.entry_points["enable"](config, activities)  # noqa: E702
        handle = p.torch.ops.profiler._record_function_enter_new(PROFILE_MARKER, None)
        p.torch.ops.profiler._record_function_exit._RecordFunction(handle)
        _interrupt_safe.call_into(session.stopped, p.entry_points["disable"])
        session.stopped[0].events()
        p.warm_cpu = True
        if cuda:
            p.warm_cuda = True
        return True
    except Exception as exc:
        p.broken[bool(cuda)] = repr(exc)
        _log.internal_error("profile-warmup", exc)
        return False
    finally:  # kineto off and the lock let go on every path, Ctrl-Cs included (_close)
        if True in got:
            interrupt = _interrupt_safe.settle(_close, session)
            if interrupt is not None:
                raise interrupt


def _load() -> bool:
    """Import torch's profiler pieces, build the configs, install the hooks (once)."""
    p = runtime.profiler
    if p.torch is not None:
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
        p.configs[on_cuda] = (config, activities)
    p.entry_points.update(prepare=_prepare_profiler, enable=_enable_profiler,
                          disable=_disable_profiler)
    install_hooks()
    _cpp_warnings.find(torch)
    p.torch = torch
    return True


def install_hooks() -> None:
    """Count the user's profiler sessions: wrap the three entry points torch.profiler calls.

    Runs at import (attnscope imports torch anyway): patching costs microseconds. A session that
    predates it is looked for only when torch's own flags say there may be one. Never raises.
    """
    p = runtime.profiler
    if p.hooked:
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
        p.hooked = True
        if _maybe_open(module) and _open_session_exists(module.profile):
            p.foreign = True  # cleared by that session's own _disable_profiler call
    except Exception as exc:
        _log.internal_error("profile-hooks", exc)


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
        try:
            return fn(*args, **kwargs)
        finally:
            runtime.profiler.foreign = False

    return release


def _claim_for_user() -> None:
    """A user's profiler is starting: make room for it, then keep attnscope's sessions out."""
    p = runtime.profiler
    try:
        session = p.active
        if session is not None and p.owner == threading.get_ident():
            # Started inside a traced call on this thread: end attnscope's session first
            # (claimed before the lock is let go, so no other thread starts one meanwhile).
            p.foreign = True
            session.aborted = True
            interrupt = _interrupt_safe.settle(_close, session)
            _skip("user_profiler")
            if interrupt is not None:
                raise interrupt
        else:
            _wait_for_session(p)
    except Exception as exc:
        _log.internal_error("profile-hook", exc)


def _wait_for_session(p: Any) -> None:
    """Another thread's attnscope session runs: the user's profiler waits for its call to end (two
    sessions crash the process), said after ``_USER_WAIT_S``, given up after
    ``_USER_WAIT_MAX_S``."""
    p.foreign = True  # no new attnscope session starts meanwhile, on any thread
    got: list[bool] = []  # filled from C: a Ctrl-C cannot lose a lock taken (_interrupt_safe)
    session = p.active  # read unlocked: it only picks the words below
    what = ("attnscope's profiler warm-up (the profiler's first use: seconds on CUDA)"
            if session is not None and session.capture is None
            else "a traced call attnscope is profiling")
    try:
        _interrupt_safe.take(p.session_lock, got, _USER_WAIT_S)
        if True not in got:
            _log.warn_once("profile-user-wait", f"attnscope: your profiler waits for {what} on "
                           "another thread to end")
            _interrupt_safe.take(p.session_lock, got, _USER_WAIT_MAX_S - _USER_WAIT_S)
            if True not in got:
                _log.warn_once("profile-user-gave-up", "attnscope: a profiled call has run for "
                               "minutes; your profiler starts beside it (two sessions may crash)")
                return
        p.foreign = True  # set under the lock: a session starting now sees it and backs off
    finally:
        if True in got:
            p.session_lock.release()


install_hooks()
atexit.register(_close_at_exit)
