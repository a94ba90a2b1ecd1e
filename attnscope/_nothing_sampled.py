"""A process in which nothing was sampled: its trace file still exists, and exit says why.

With the defaults (``sample_rate=0.01`` after ``warmup_calls=10`` calls at each call site) a short
script often samples nothing; no worker starts, so no exporter would ever write. Here, without
starting one: ``flush()`` and exit write a file exporter's empty document (``{"data":[]}`` for
``jaeger-json``, an empty file for ``otlp-json``), and exit logs one INFO line naming the settings.
"""

from __future__ import annotations

from typing import Any

from . import _log
from ._config import EXPORTER_PREFIXES, Config
from ._runtime import runtime

__all__ = ["at_exit", "nothing_sampled", "write_empty_file"]


def nothing_sampled() -> bool:
    """No call of this process was sampled and no worker ever ran."""
    return (runtime.worker.current is None and runtime.sampler.sampled == 0
            and not runtime.worker.retired_counts.get("captured", 0))


def write_empty_file(cfg: Config) -> None:
    """Make the configured trace file exist: a file exporter's own first flush writes it."""
    exporter: Any = cfg.exporter
    try:
        if isinstance(exporter, str):
            if not exporter.startswith(EXPORTER_PREFIXES):
                return
            from ._export.destinations import make_exporter

            made = make_exporter(exporter)
            if made is not None:
                made.force_flush()
                made.shutdown()  # releases the file for a worker that starts later
        elif type(exporter).__module__.startswith("attnscope._export."):
            exporter.force_flush()  # the application's instance: flushed, left open
    except Exception as exc:
        _log.internal_error("empty-file", exc)


def at_exit() -> None:
    """Registered at import; runs after the worker's exit hook. Never raises."""
    try:
        cfg = runtime.config.current
        if cfg is None or not cfg.enabled or not nothing_sampled():
            return
        write_empty_file(cfg)
        _log.info_once(
            "nothing-sampled",
            "attnscope: no call was sampled in this process, so no spans were sent (sampling "
            f"starts after warmup_calls={cfg.warmup_calls} calls at each call site, then times "
            f"sample_rate={cfg.sample_rate} of calls). For a short experiment: "
            "attnscope.configure(sample_rate=1.0, warmup_calls=0), or ATTNSCOPE_SAMPLE_RATE=1 "
            "ATTNSCOPE_WARMUP_CALLS=0", sample_rate=cfg.sample_rate,
            warmup_calls=cfg.warmup_calls)
    except BaseException:
        pass
