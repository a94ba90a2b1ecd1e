"""A finished profiler session → kernel/operator child spans and attributes (worker side)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import _log, _safe_files
from .. import _schema as schema
from .._record.capture import PROFILE_MARKER, Capture
from .._units import top_list
from . import kernels
from .windows import nested_kernels

if TYPE_CHECKING:
    from .._config import Config
    from .._derive.result import Derived

__all__ = ["finish", "hand_back"]

_TIER = schema.TIER.key
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def hand_back() -> None:
    """Let a thread waiting for the GIL have it. Reading a profile is milliseconds of Python in
    one piece (4 ms and more for a model's layer on CPU), which the application's thread waited
    for whole whenever it needed the GIL meanwhile; between the steps it waits for one step."""
    time.sleep(0)


def finish(cap: Capture, cfg: Config, derived: Derived | None = None,
           nested: Sequence[tuple[int, int]] = ()
           ) -> tuple[dict[str, Any], list[Any], list[dict[str, Any]]]:
    """Span attributes (schema keys, no prefix) and kernel child spans of a profiled capture,
    and the kernel attributes of the calls timed inside it (:func:`.windows.nested_kernels`:
    one dict per ``nested`` call's start and end, empty when unknown).

    ``derived``: what derive found for the capture; its ``flops`` give ``core_tflops`` (FLOPs
    over the attention core's time).
    """
    session = cap.profile
    result = session.result if session is not None else None
    none: list[dict[str, Any]] = [{} for _ in nested]
    if session is None or result is None:  # aborted for a user's profiler, or stopping failed
        return {_TIER: "timing"}, [], none
    try:
        events = kernels.from_kineto(result, PROFILE_MARKER, pause=hand_back)
        hand_back()
        report = kernels.analyze(events, span_start_ns=cap.start_epoch_ns,
                                 span_end_ns=cap.end_epoch_ns, max_spans=cfg.max_kernel_spans,
                                 on_device=session.on_cuda, module=cap.instance)
        hand_back()
    except Exception as exc:  # the span still goes out, without kernel data
        _log.internal_error("profile-parse", exc)
        return {_TIER: "timing"}, [], none
    try:
        inside = nested_kernels(events, nested, span_start_ns=cap.start_epoch_ns,
                                span_end_ns=cap.end_epoch_ns, on_device=session.on_cuda)
    except Exception as exc:  # the nested calls' spans go out without them
        _log.internal_error("profile-parse", exc)
        inside = none
    attrs = report.attributes
    names, times = attrs.get(schema.KERNEL_TOP_NAMES.key), attrs.get(schema.KERNEL_TOP_NS.key)
    if isinstance(names, (list, tuple)) and isinstance(times, (list, tuple)):
        # one list a person reads ("aten::mm: 1.2 ms"); the two exact ones stay for the CLI
        attrs[schema.KERNEL_TOP.key] = top_list(names, times)
    flops = derived.get(schema.FLOPS.key) if derived is not None else None
    core = attrs.get(schema.CORE_NS.key)
    if isinstance(flops, int) and isinstance(core, int) and core > 0:
        attrs[schema.CORE_TFLOPS.key] = flops / core / 1e3  # FLOP/ns = 1e9 FLOP/s; TFLOP/s = /1e3
    if cfg.profile_dir:
        try:
            saved = _save(result, cfg.profile_dir, cap)
            if saved is not None:
                attrs[schema.PROFILE_PATH.key] = saved
        except _safe_files.UnsafePath as exc:  # a link at the name: not written through
            _log.warn_once("profile-link", "attnscope: a profile was not saved: "
                           f"{exc.strerror}", path=exc.filename)
        except Exception as exc:
            _log.internal_error("profile-save", exc)
    return attrs, report.children, inside


# Chrome-trace event args that hold argument values (scalars such as a softmax scale or a dropout
# probability) rather than shapes and types: attnscope records no values, here either.
_VALUE_ARGS = ("Concrete Inputs",)


def _save(result: Any, directory: str, cap: Capture) -> str | None:
    """The saved trace's path; None when ``directory`` is one others can write in (said once).

    The names are predictable (site, pid, capture id), so nothing is ever opened under them:
    torch writes its trace into a private directory (``mkdtemp``: 0700, a name nobody could
    have planted), and the cleaned trace is renamed onto its name, a link there refused."""
    os.makedirs(directory, exist_ok=True)
    problem = _safe_files.directory_problem(directory)
    if problem is not None:
        _log.warn_once("profile-dir-unsafe", f"attnscope: profile_dir is {problem}: "
                       "profiles are not saved there (another user could plant links at their "
                       "names); choose a directory of your own", profile_dir=directory)
        return None
    name = _UNSAFE.sub("_", cap.name)[:64] or "call"
    path = os.path.abspath(
        os.path.join(directory, f"{name}-{os.getpid()}-{cap.capture_id}.pt.trace.json"))
    private = tempfile.mkdtemp(prefix=".attnscope-profile-", dir=directory)
    try:
        raw = os.path.join(private, "trace.json")
        result.save(raw)
        with open(raw, encoding="utf-8") as f:
            trace = json.load(f)
        for event in trace.get("traceEvents", ()):
            args = event.get("args") if isinstance(event, dict) else None
            if isinstance(args, dict):
                for key in _VALUE_ARGS:
                    args.pop(key, None)
        _safe_files.write_text(path, json.dumps(trace))
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return path
