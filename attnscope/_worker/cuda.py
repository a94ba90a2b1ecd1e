"""How the worker thread touches CUDA without disturbing the application's GPU work.

- **Relaxed stream-capture mode** for the worker thread (``cudaThreadExchangeStreamCaptureMode``,
  as PyTorch's own caching allocator does around its calls): while another thread captures a CUDA
  graph in the default global mode, "potentially unsafe" calls such as ``cudaEventQuery`` from any
  thread still in global mode invalidate that capture.
- **The capture's device made current** before the worker's first CUDA call: the first runtime
  call of a thread without a current device creates a context on GPU 0 (hundreds of MB) in a
  process that may only use another GPU.
- **Reads on a side stream** of that device (a non-blocking stream from PyTorch's pool): never on
  the legacy default stream, which waits for the application's streams (the worker would wait
  behind its work) and, during a capture, would break it.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from typing import Any

from .. import _log

__all__ = ["relax_capture_mode", "DeviceAccess"]

_RELAXED = 2  # cudaStreamCaptureModeRelaxed (cudaStreamCaptureModeGlobal = 0, ThreadLocal = 1)


def _cudart_exchange() -> Callable[[Any], int] | None:
    """``cudaThreadExchangeStreamCaptureMode`` of the CUDA runtime torch loaded, if any."""
    for path in _loaded_cudart_paths():
        try:
            fn = ctypes.CDLL(path).cudaThreadExchangeStreamCaptureMode
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
        fn.restype = ctypes.c_int
        return fn
    return None


def _loaded_cudart_paths() -> list[str]:
    """The CUDA runtime libraries mapped into this process.

    torch's, from its wheels or the system.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            found = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        found = set()
    return sorted(found) or ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]


def relax_capture_mode(exchange: Callable[[Any], int] | None = None) -> bool:
    """Put the calling (worker) thread in relaxed capture mode; False if that was not possible."""
    fn = exchange if exchange is not None else _cudart_exchange()
    if fn is None:
        _log.debug_once("cuda-relaxed", "attnscope: CUDA runtime not found; the worker stays in "
                        "global capture mode")
        return False
    mode = ctypes.c_int(_RELAXED)
    status = fn(ctypes.byref(mode))
    if status != 0:
        _log.warn_once("cuda-relaxed", "attnscope: could not set the worker's capture mode",
                       status=status)
        return False
    return True


class DeviceAccess:
    """The worker's way onto a device: prepared once per thread, a side stream per device."""

    def __init__(self, torch_cuda: Any = None,
                 relax: Callable[[], bool] = relax_capture_mode) -> None:
        self._cuda = torch_cuda
        self._relax = relax
        self._prepared = False
        self.relaxed = False
        self._streams: dict[int, Any] = {}

    def _torch_cuda(self) -> Any:
        if self._cuda is None:
            import torch

            self._cuda = torch.cuda
        return self._cuda

    def prepare(self, device: Any) -> None:
        """Before the worker's first CUDA call: ``device`` current on this thread, relaxed mode.
        Runs on the worker thread; a failure is logged and the worker goes on."""
        if self._prepared:
            return
        self._prepared = True
        try:
            index = _index(device)
            if index is not None:
                self._torch_cuda().set_device(index)
            self.relaxed = self._relax()
        except Exception as exc:
            _log.internal_error("cuda-prepare", exc)

    @contextlib.contextmanager
    def reading(self, device: Any) -> Iterator[None]:
        """Device reads (token counts, cache lengths) on this device's side stream; where that
        cannot be set up (logged once), the reads go on without it."""
        with self._side_stream(device):
            yield

    def _side_stream(self, device: Any) -> contextlib.AbstractContextManager[Any]:
        index = _index(device)
        if index is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        try:
            cuda = self._torch_cuda()
            stream = self._streams.get(index)
            if stream is None:
                stream = self._streams[index] = cuda.Stream(device=index)
            stack.enter_context(cuda.device(index))
            stack.enter_context(cuda.stream(stream))
        except Exception as exc:
            stack.close()
            _log.internal_error("cuda-side-stream", exc)
            return contextlib.nullcontext()
        return stack


def _index(device: Any) -> int | None:
    index = getattr(device, "index", device)
    return index if isinstance(index, int) and not isinstance(index, bool) else None
