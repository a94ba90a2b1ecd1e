"""Write spans as a Jaeger JSON file that the Jaeger UI opens without any backend.

The document has the shape of Jaeger's query API response (``{"data": [trace, ...]}``): one entry
per trace, each with its spans and its own process table. Jaeger UI's "Upload" / "JSON File"
search tab renders it.

The whole file is rewritten atomically (temp file in the same directory, fsync, ``os.replace``),
so a reader never sees half a document. Which paths are accepted, permissions and the one-writer
lock: :mod:`attnscope._export.files`. Writes happen on ``force_flush()``, ``shutdown()``, on
rotation, and from ``export()`` at most once per ``flush_interval_s``: the SDK's span processors
never call an exporter's ``force_flush()``, so without the interval the file would only appear at
shutdown. The encoding of spans: :mod:`attnscope._export.jaeger_encode`.

attnscope's pipeline counts a span exported only once a write that holds it succeeded, and failed
once it can no longer reach the file (``attnscope_bind_delivery``): between the two it is in
``stats()["export_in_flight"]``. A file an exporter of this process wrote is read back by the next
exporter opened on it (a restarted worker), so a restart adds to the file instead of replacing it.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .._log import internal_error, warn_once
from .._runtime import runtime
from . import files, jaeger_encode

__all__ = ["JaegerJSONFileExporter"]

_STAGE = "exporter.jaeger_json"
_DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class JaegerJSONFileExporter(SpanExporter):
    """Keep exported spans in memory and write them to ``path`` as one Jaeger JSON document.

    Each write replaces the file with every span since the last rotation. When the document
    would grow past ``max_bytes``, the current file moves to ``path.1`` (older ones to ``.2`` ...
    up to ``backups``; ``backups=0`` keeps none) and a new document starts, so memory and each
    file stay bounded by ``max_bytes``, except that a single span larger than that gets a file to
    itself. An existing file at ``path`` is replaced by the first write, unless an exporter of
    this process wrote it (a worker restarted by ``shutdown()`` or ``configure()``): then its
    traces are read back and kept in the document. ``service_name``
    overrides the resource's ``service.name``. ``export()`` rewrites the file at most once per
    ``flush_interval_s`` seconds (``None``: only on flush, shutdown and rotation); each rewrite
    costs time proportional to the document, up to ``max_bytes``.

    ``path`` must be a regular file or not exist, in an existing directory (``ValueError``
    otherwise); while another process writes it, this one writes ``path`` with its pid before
    the extension (:mod:`attnscope._export.files`). A failed write (full disk, read-only file
    system, ...) makes ``export()`` return FAILURE and the next ``force_flush()`` False; the
    spans stay in memory for the next write. Spans that end in no file are counted in
    ``dropped_spans``.
    """

    attnscope_writes_files = True  # local work at exit: see export.pipeline

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = _DEFAULT_MAX_BYTES,
        backups: int = 3,
        service_name: str | None = None,
        flush_interval_s: float | None = 5.0,
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        if isinstance(backups, bool) or not isinstance(backups, int) or backups < 0:
            raise ValueError(f"backups must be an int >= 0, got {backups!r}")
        if flush_interval_s is not None and (
            isinstance(flush_interval_s, bool)
            or not isinstance(flush_interval_s, (int, float))
            or not flush_interval_s >= 0  # also rejects NaN
        ):
            raise ValueError(f"flush_interval_s must be >= 0 or None, got {flush_interval_s!r}")
        requested = os.path.abspath(os.fspath(path))
        files.check_target(requested, f"{type(self).__name__} path")
        self._max_bytes = max_bytes
        self._backups = backups
        self._service_name = service_name
        self._flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        self._shut_down = False
        # The document being built: every span since the last rotation, already serialised.
        self._traces: dict[str, jaeger_encode.Trace] = {}
        self._size = jaeger_encode.EMPTY_DOCUMENT_BYTES
        self._span_count = 0
        # True: the first flush writes the file even with no span (a valid, empty document)
        self._dirty = True
        self._written = 0  # spans of the document in the file now
        self._last_write = -math.inf
        self._backup_counts: list[int] = []  # spans in path.1, path.2, ... written by us
        self._dropped = 0
        self._lost = False  # spans lost to a failure since the last force_flush()
        # Most programs have one Resource, so a one-entry identity cache avoids re-serialising it.
        self._last_process: tuple[Resource, str] | None = None
        self._writer = jaeger_encode.SpanWriter()  # span texts, each tag's text kept
        # attnscope's pipeline, told when spans reach the file or are lost: (written, lost)
        self._on_delivery: Callable[[int, int], None] | None = None
        self._unbound = 0  # spans taken before that, still unwritten: not the pipeline's
        # Last: the one-writer lock, held until shutdown() (or garbage collection).
        self._claim = files.claim(requested, warn_once)
        self._path = self._claim.path
        # by (st_dev, st_ino): the same file reached through another spelling is the same file
        if files.same_path(self._path, list(runtime.delivery.written_paths)):
            self._keep_existing()

    def attnscope_bind_delivery(self, report: Callable[[int, int], None]) -> None:
        """Call ``report(written, lost)`` as spans exported from now on reach the file (written)
        or will never reach it (lost); used by attnscope's pipeline to count a span exported
        only once it is on disk. Each span is reported once."""
        with self._lock:
            self._unbound = self._span_count - self._written
            self._on_delivery = report

    @property
    def path(self) -> str:
        """The file written: the given path, or this process's own when another one held it."""
        return self._path

    @property
    def dropped_spans(self) -> int:
        """Spans accepted but kept in no file: lost to a failed write or rotated out."""
        with self._lock:
            return self._dropped

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Add ``spans`` to the document; write it if rotated or the interval passed."""
        try:
            with self._lock:
                if self._shut_down:
                    warn_once(_STAGE + ".after_shutdown", "export() after shutdown(); spans lost")
                    self._settle(0, len(spans))
                    return SpanExportResult.FAILURE
                ok = True
                rotated = False
                for span in spans:
                    try:
                        added, did_rotate = self._add(span)
                    except Exception as exc:  # noqa: BLE001 (this span is lost, the others are not)
                        internal_error(_STAGE, exc)
                        self._settle(0, 1)
                        added, did_rotate = False, False
                    ok = ok and added
                    rotated = rotated or did_rotate
                if self._dirty and (rotated or self._interval_passed()):
                    ok = self._write_current() and ok
            return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE
        except Exception as exc:
            internal_error(_STAGE, exc)
            return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write the document now. False if that failed or spans were lost since the last call."""
        with self._lock:
            ok = self._write_current() if self._dirty else True
            ok = ok and not self._lost
            self._lost = False
            return ok

    def shutdown(self) -> None:
        """Write the document, release the file and refuse later exports. Safe to call twice."""
        with self._lock:
            # Under the same lock as the flag, so no export can slip in between and be lost.
            if self._shut_down:
                return
            if self._dirty and not self._write_current():
                unwritten = self._span_count - self._written
                self._count_lost(unwritten)
                self._settle(0, unwritten)
            self._shut_down = True
            self._traces = {}
            self._claim.release()

    # -- internals; all run with self._lock held ---------------------------------------------

    def _settle(self, written: int, lost: int) -> None:
        """Tell the pipeline (if any) that spans reached the file or never will."""
        report = self._on_delivery
        if report is None or not (written or lost):
            return
        # spans taken before the pipeline bound this exporter resolve first (each write takes
        # every unwritten span), and are not the pipeline's to count
        skip = min(self._unbound, written + lost)
        self._unbound -= skip
        skip_written = min(skip, written)
        written, lost = written - skip_written, lost - (skip - skip_written)
        if written or lost:
            report(written, lost)

    def _keep_existing(self) -> None:
        """Read back the document an exporter of this process wrote at the path (a restarted
        worker), so that the first write keeps its spans instead of replacing them."""
        try:
            document = json.loads(files.read_regular(self._path))
            kept = 0
            for trace in document.get("data") or ():
                trace_id = str(trace["traceID"])
                processes = trace.get("processes") or {}
                for fields in trace.get("spans") or ():
                    process = jaeger_encode.dumps(processes[fields["processID"]])
                    text, pid, added = self._encode(
                        trace_id, jaeger_encode.parts_of_fields(fields), process)
                    entry = self._traces.setdefault(trace_id, jaeger_encode.Trace())
                    entry.processes.setdefault(process, pid)
                    entry.add(text)
                    self._size += added
                    kept += 1
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001 (not our document: replaced, as any other)
            self._traces, self._size, kept = {}, jaeger_encode.EMPTY_DOCUMENT_BYTES, 0
            warn_once(_STAGE + ".reread", "attnscope: cannot read back the Jaeger JSON file "
                      "this process wrote; the next write replaces it", path=self._path,
                      error=files.describe(exc))
        self._span_count = self._written = kept

    def _count_lost(self, spans: int) -> None:
        self._dropped += spans
        self._lost = True
        if spans:
            warn_once(_STAGE + ".lost", "attnscope: spans lost: the Jaeger JSON file could not "
                      "be written", path=self._path, spans=spans)

    def _report(self, exc: Exception) -> None:
        """A failed write: logged (rate-limited), never raised. OSError is the disk's, not ours."""
        if isinstance(exc, OSError):
            warn_once(_STAGE + ".write", "attnscope: cannot write the Jaeger JSON file; spans "
                      "stay in memory for the next write", path=self._path,
                      error=files.describe(exc))
        else:
            internal_error(_STAGE, exc)

    def _interval_passed(self) -> bool:
        interval = self._flush_interval_s
        return interval is not None and time.monotonic() - self._last_write >= interval

    def _process_for(self, resource: Resource) -> str:
        cached = self._last_process
        if cached is None or cached[0] is not resource:
            cached = (resource, jaeger_encode.process_json(resource, self._service_name))
            self._last_process = cached
        return cached[1]

    def _encode(
        self, trace_id: str, parts: tuple[str, str], process: str
    ) -> tuple[str, str, int]:
        """The span's text (``parts``: before and after its processID) for the current
        document: (text, processID, bytes added)."""
        trace = self._traces.get(trace_id)
        added = 0
        pid = trace.processes.get(process) if trace is not None else None
        if pid is None:
            pid = f"p{len(trace.processes) + 1 if trace is not None else 1}"
            added += len(pid) + 3 + len(process) + 1  # "pN": + process + comma
        if trace is None:
            added += jaeger_encode.TRACE_OVERHEAD_BYTES
        text = parts[0] + pid + parts[1]
        return text, pid, added + len(text) + 1

    def _add(self, span: ReadableSpan) -> tuple[bool, bool]:
        """Add one span: (no spans were lost, the document rotated)."""
        if span.context is None:
            self._settle(0, 1)  # nothing to write: it never reaches the file
            return True, False
        parts = self._writer.parts(span)
        trace_id = f"{span.context.trace_id:032x}"
        process = self._process_for(span.resource)
        text, pid, added = self._encode(trace_id, parts, process)
        ok, rotated = True, False
        if self._span_count and self._size + added > self._max_bytes:
            ok = self._rotate()
            rotated = True
            text, pid, added = self._encode(trace_id, parts, process)
        trace = self._traces.setdefault(trace_id, jaeger_encode.Trace())
        trace.processes.setdefault(process, pid)
        trace.add(text)
        self._size += added
        self._span_count += 1
        self._dirty = True
        return ok, rotated

    def _document(self) -> list[bytes | bytearray]:
        # in pieces, written as they are: one joined document held the GIL for the whole copy
        # (160 ms for 60 MB here), a pause for every thread of the program at each rewrite
        return jaeger_encode.document_chunks(self._traces)

    def _write_current(self) -> bool:
        """Replace the file with the current document; False (reported) if that failed."""
        # Also after a failure: a full disk is retried at the interval, not on every export.
        self._last_write = time.monotonic()
        try:
            files.write_atomically(self._path, self._document())
        except Exception as exc:
            self._report(exc)
            return False
        runtime.delivery.written_paths.add(self._path)
        self._dirty = False
        self._settle(self._span_count - self._written, 0)
        self._written = self._span_count
        return True

    def _rotate(self) -> bool:
        """Seal the current document into ``path.1`` and start an empty one.

        The document is dropped from memory even if writing it fails, so a full disk cannot
        make memory grow; those spans are counted as dropped. Returns False in that case.
        """
        count = self._span_count
        ok = True
        written = False
        try:
            # written first, also without backups: a span counts as exported once in a file
            files.write_atomically(self._path, self._document())
            written = True
            runtime.delivery.written_paths.add(self._path)
            self._settle(count - self._written, 0)
            if self._backups == 0:
                self._dropped += count  # rotated out, as configured: not a failure
            else:
                files.rotate(self._path, self._backups)
                self._keep_backup(count)
        except Exception as exc:
            self._report(exc)
            self._count_lost(count)
            if not written:
                self._settle(0, count - self._written)
            ok = False
        self._traces = {}
        self._size = jaeger_encode.EMPTY_DOCUMENT_BYTES
        self._span_count = 0
        self._written = 0
        self._dirty = False
        return ok

    def _keep_backup(self, count: int) -> None:
        """Account for a rotation: ``count`` spans now in path.1; what fell off the end is lost."""
        if len(self._backup_counts) >= self._backups:
            self._dropped += sum(self._backup_counts[self._backups - 1 :])
            del self._backup_counts[self._backups - 1 :]
        self._backup_counts.insert(0, count)
