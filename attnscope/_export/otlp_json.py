"""Append spans to a file as OTLP/JSON lines: one ``ExportTraceServiceRequest`` per line.

Each ``export()`` call becomes one line: the OTLP exporter's own ``encode_spans`` in the protobuf
JSON mapping (lowerCamelCase keys, 64-bit integers as decimal strings), written directly by
:mod:`.otlp_json_text` (the same text, checked on probe spans once a process). Two changes
follow the OTLP/JSON spec where it departs from the plain protobuf mapping:

- ``traceId``, ``spanId`` and ``parentSpanId`` (also in links) are lowercase hex, not base64;
- enum values (span kind, status code) are integers, not names.

Plain ``google.protobuf.json_format.Parse`` therefore rejects the ids; use
:func:`read_otlp_json_lines`, which converts them back first.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .._log import internal_error, warn_once
from . import files
from .otlp_encode import first_variant
from .otlp_json_text import JsonEncoder, matches_reference

__all__ = ["OTLPJSONFileExporter", "read_otlp_json_lines"]

_STAGE = "exporter.otlp_json"
_DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def _convert_ids(request: dict[str, Any], convert: Callable[[str], str]) -> None:
    """Apply ``convert`` to every span and link id in a request dict, in place."""
    for resource_spans in request.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for obj in (span, *span.get("links", ())):
                    for key in _ID_KEYS:
                        value = obj.get(key)
                        if isinstance(value, str) and value:
                            obj[key] = convert(value)


def _reference_line(spans: Sequence[ReadableSpan]) -> str:
    """One OTLP/JSON line (ending in a newline) holding ``spans``, by the SDK's encoder and
    protobuf's JSON mapping: what :func:`_encode_line` writes, ~12x slower."""
    request = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    _convert_ids(request, _b64_to_hex)
    return json.dumps(request, separators=(",", ":")) + "\n"


@functools.cache
def _fast() -> JsonEncoder | None:
    """The direct writer in the variant that matches the reference here, else None."""
    try:
        return first_variant(JsonEncoder,
                             lambda candidate: matches_reference(candidate, _reference_line))
    except Exception as exc:  # the reference way, as before
        internal_error(_STAGE, exc)
    return None


def _encode_line(spans: Sequence[ReadableSpan]) -> str:
    """One OTLP/JSON line (ending in a newline) holding ``spans``: written directly
    (:mod:`.otlp_json_text`), or the reference way when that cannot write it exactly."""
    fast = _fast()
    line = fast.line(spans) if fast is not None else None
    return line if line is not None else _reference_line(spans)


def read_otlp_json_lines(path: str | os.PathLike[str]) -> list[ExportTraceServiceRequest]:
    """Parse a file written by :class:`OTLPJSONFileExporter`, one request per non-empty line.

    Raises ``ValueError`` naming the line when one is not valid OTLP/JSON.
    """
    requests: list[ExportTraceServiceRequest] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                _convert_ids(data, _hex_to_b64)
                message = ExportTraceServiceRequest()
                json_format.ParseDict(data, message)
            except (ValueError, json_format.ParseError) as exc:
                raise ValueError(f"{os.fspath(path)}:{lineno}: not OTLP/JSON: {exc}") from exc
            requests.append(message)
    return requests


class OTLPJSONFileExporter(SpanExporter):
    """Append one OTLP/JSON line per ``export()`` call to ``path``, flushed as it is written.

    When a line would take the file past ``max_bytes``, ``path`` moves to ``path.1`` (older ones
    to ``.2`` ... up to ``backups``; ``backups=0`` keeps none) and a new file starts. A line
    larger than ``max_bytes`` gets a file to itself. An existing file at ``path`` is appended to.
    If the file is deleted or replaced while the exporter runs, the next line goes to a new file
    at ``path`` (and fails, counted, if its directory is gone), never into the unlinked one.

    ``path`` must be a regular file or not exist, in an existing directory (``ValueError``
    otherwise); while another process writes it, this one writes ``path`` with its pid before
    the extension (:mod:`attnscope._export.files`). A line that cannot be written (full disk,
    read-only file system, ...) is lost: ``export()`` returns FAILURE, the spans are counted in
    ``dropped_spans`` and the next ``force_flush()`` returns False.
    """

    attnscope_writes_files = True  # local work at exit: see export.pipeline

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = _DEFAULT_MAX_BYTES,
        backups: int = 3,
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        if isinstance(backups, bool) or not isinstance(backups, int) or backups < 0:
            raise ValueError(f"backups must be an int >= 0, got {backups!r}")
        requested = os.path.abspath(os.fspath(path))
        files.check_target(requested, f"{type(self).__name__} path")
        self._max_bytes = max_bytes
        self._backups = backups
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._shut_down = False
        self._dropped = 0
        self._lost = False  # spans lost since the last force_flush()
        # Last: the one-writer lock, held until shutdown() (or garbage collection).
        self._claim = files.claim(requested, warn_once)
        self._path = self._claim.path

    @property
    def path(self) -> str:
        """The file lines are appended to: the given path, or this process's own (see above)."""
        return self._path

    @property
    def dropped_spans(self) -> int:
        """Spans in lines that could not be written."""
        with self._lock:
            return self._dropped

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append ``spans`` as one line. Never raises."""
        try:
            if not spans:
                return SpanExportResult.SUCCESS
            if self._shut_down:
                warn_once(_STAGE + ".after_shutdown", "export() after shutdown(); spans lost")
                return SpanExportResult.FAILURE
            # Encoding is the expensive part and needs no lock.
            data = _encode_line(spans).encode("utf-8")
        except Exception as exc:
            with self._lock:
                self._report(exc, len(spans))
            return SpanExportResult.FAILURE
        with self._lock:
            if self._shut_down:  # shutdown() won the race while we encoded
                return SpanExportResult.FAILURE
            try:
                self._write(data)
            except Exception as exc:
                self._report(exc, len(spans))
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Create (if needed) and fsync the file. False if that failed or spans were lost since
        the last call."""
        with self._lock:
            ok = not self._lost
            self._lost = False
            try:
                self._drop_stale()
                if self._fd is None and not self._shut_down:
                    self._open()  # the file exists after a flush, even with no line in it
                if self._fd is not None:
                    os.fsync(self._fd)
            except Exception as exc:
                self._report(exc, 0)
                ok = False
            return ok

    def shutdown(self) -> None:
        """Flush, close and release the file, refuse later exports. Safe to call twice."""
        self.force_flush()
        with self._lock:
            self._shut_down = True
            self._close()
            self._claim.release()

    # -- internals; all run with self._lock held ---------------------------------------------

    def _count_lost(self, spans: int) -> None:
        self._dropped += spans
        self._lost = True

    def _report(self, exc: Exception, lost: int) -> None:
        """A failed write or fsync: counted, logged (rate-limited), never raised."""
        self._count_lost(lost)
        if isinstance(exc, OSError):  # the disk's failure, not attnscope's
            warn_once(_STAGE + ".write", "attnscope: cannot write the OTLP/JSON file; spans lost",
                      path=self._path, error=files.describe(exc), spans=lost)
        else:
            internal_error(_STAGE, exc)

    def _open(self) -> int:
        # A raw descriptor: a failed write leaves nothing behind in a buffer to land later.
        fd = files.open_append(self._path)
        self._size = os.fstat(fd).st_size
        self._fd = fd
        return fd

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                self._report(exc, 0)

    def _drop_stale(self) -> None:
        """Close the descriptor if the path no longer names its file (deleted, replaced, its
        directory removed): lines written there would be lost with no error."""
        if self._fd is not None and not files.same_file(self._fd, self._path):
            self._close()

    def _write(self, data: bytes) -> None:
        self._drop_stale()  # two stat calls a line: a line lands where the path points
        fd = self._fd if self._fd is not None else self._open()
        if self._size > 0 and self._size + len(data) > self._max_bytes:
            self._close()
            files.rotate(self._path, self._backups)
            fd = self._open()
        try:
            files.write_all(fd, data)
        except BaseException:
            # Cut off a partial line so the next one does not start glued to garbage.
            try:
                os.ftruncate(fd, self._size)
            except OSError:
                pass
            raise
        self._size += len(data)
