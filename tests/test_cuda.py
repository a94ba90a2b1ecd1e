"""The worker's CUDA manners, with fakes (issue 15 items 1 and 7; the GPU test is in tests/gpu)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pytest

from attnscope._worker import cuda


def test_relaxed_mode_is_asked_for_with_the_runtime_call() -> None:
    seen: list[int] = []

    def exchange(mode_ptr: Any) -> int:
        seen.append(ctypes.cast(mode_ptr, ctypes.POINTER(ctypes.c_int)).contents.value)
        return 0

    assert cuda.relax_capture_mode(exchange)
    assert seen == [2]  # cudaStreamCaptureModeRelaxed



def test_without_a_cuda_runtime_the_worker_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "_loaded_cudart_paths", lambda: ["/nonexistent/libcudart.so.12"])
    assert cuda.relax_capture_mode() is False


class FakeCuda:
    """torch.cuda as far as DeviceAccess uses it, recording the calls and their thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str]] = []

    def _note(self, what: str, arg: Any) -> None:
        self.calls.append((what, arg, threading.current_thread().name))

    def set_device(self, index: int) -> None:
        self._note("set_device", index)

    def Stream(self, device: int) -> str:  # noqa: N802 (torch's name)
        self._note("Stream", device)
        return f"side{device}"

    def device(self, index: int) -> Any:
        return self._ctx("device", index)

    def stream(self, stream: str) -> Any:
        return self._ctx("stream", stream)

    def _ctx(self, what: str, arg: Any) -> Any:
        fake = self

        class Ctx:
            def __enter__(self) -> None:
                fake._note(what, arg)

            def __exit__(self, *exc: Any) -> None:
                fake._note("exit-" + what, arg)

        return Ctx()


class Dev:
    def __init__(self, index: int) -> None:
        self.type, self.index = "cuda", index


def test_prepare_makes_the_captures_device_current_once_then_relaxes() -> None:
    fake = FakeCuda()
    relaxed: list[int] = []
    access = cuda.DeviceAccess(fake, relax=lambda: relaxed.append(1) or True)
    access.prepare(Dev(1))
    access.prepare(Dev(0))  # once per worker thread: the first device is current
    assert fake.calls == [("set_device", 1, threading.current_thread().name)]
    assert relaxed == [1] and access.relaxed


def test_reads_run_on_a_side_stream_of_the_captures_device() -> None:
    fake = FakeCuda()
    access = cuda.DeviceAccess(fake, relax=lambda: True)
    for index in (1, 1, 0):
        with access.reading(Dev(index)):
            fake._note("read", index)
    names = [(what, arg) for what, arg, _ in fake.calls]
    assert names[:5] == [("Stream", 1), ("device", 1), ("stream", "side1"), ("read", 1),
                         ("exit-stream", "side1")]
    assert names.count(("Stream", 1)) == 1 and ("Stream", 0) in names  # one side stream per device


def test_cpu_captures_never_touch_cuda() -> None:
    fake = FakeCuda()
    access = cuda.DeviceAccess(fake, relax=lambda: True)
    with access.reading(None):
        pass
    assert fake.calls == []


def test_a_failing_runtime_call_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    assert cuda.relax_capture_mode(lambda ptr: 700) is False
    assert any("capture mode" in r.getMessage() for r in caplog.records)
