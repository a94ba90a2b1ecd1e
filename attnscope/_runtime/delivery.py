"""What happened to spans after attnscope built them: the export counts of ``attnscope.stats()``."""

from __future__ import annotations

import threading

__all__ = ["Delivery"]


class Delivery:
    """What happened to spans after attnscope built them (our own provider only), over every
    pipeline of the process.

    Counts spans, kernel child spans included. A provider attnscope does not own delivers the
    application's way: its losses are the application's exporter's to report. Every span handed
    to the batch processor is in exactly one of ``in_flight``, ``exported``, ``export_failed``,
    ``export_queue_full``: it enters ``in_flight`` and leaves it once, under ``lock`` (several
    threads move spans: the worker, the batch processor's thread, flush and shutdown helpers).
    """

    __slots__ = ("export_failed", "export_queue_full", "exported", "in_flight", "lock",
                 "no_pipeline", "to_export", "written_paths")

    def __init__(self) -> None:
        # spans the worker handed to the pipeline (worker.emit, under ``lock``): each ends in
        # exactly one of the counts below
        self.to_export = 0
        self.exported = 0  # spans the exporter delivered (a file exporter: once in the file)
        self.export_failed = 0  # spans the exporter reported as failed, or lost before the file
        self.export_queue_full = 0  # spans the batch processor dropped: its queue was full, or
        # it had shut down, or its shutdown gave up on them
        self.no_pipeline = 0  # spans built while no pipeline could be built: sent nowhere
        self.in_flight = 0  # handed to the batch processor, neither delivered nor lost yet
        self.lock = threading.Lock()
        # trace files attnscope's file exporters wrote in this process: an exporter opened on
        # one again (a restarted worker) keeps what the file holds
        self.written_paths: set[str] = set()

    def queued(self) -> None:
        """One span entered the batch processor's queue."""
        with self.lock:
            self.in_flight += 1

    def settle(self, exported: int = 0, failed: int = 0, dropped: int = 0) -> None:
        """Spans in flight reached their end: delivered, failed, or dropped unexported."""
        with self.lock:
            self.exported += exported
            self.export_failed += failed
            self.export_queue_full += dropped
            self.in_flight -= exported + failed + dropped

    def counts(self) -> dict[str, int]:
        """The export keys of ``attnscope.stats()``."""
        with self.lock:
            return {"exported": self.exported, "export_failed": self.export_failed,
                    "export_dropped": self.export_queue_full + self.no_pipeline,
                    "export_in_flight": self.in_flight}

    @property
    def lost(self) -> int:
        return self.export_failed + self.export_queue_full + self.no_pipeline

