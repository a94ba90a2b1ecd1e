"""CUDA fallback verdicts ask torch's checks about the call's own device (issue 36 §2).

torch's ``can_use_*`` checks reject meta tensors on CUDA ("All tensors need to be on cuda device.
Got query on device: meta"), so every CUDA call was judged with no fused backend eligible. This
machine has no CUDA: the checks are replaced by recorders, and a CUDA call's facts are faked in
its argument summary. What the recorders see (the device type, index, shapes, strides, dtype) is
what torch's real checks would be handed; their CUDA answers themselves are verified only on a GPU
(tests/gpu/test_gpu_fallback.py).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attnscope._derive import fallback
from attnscope._derive.fallback import Inputs, Verdict, assess
from attnscope._record.capture import SdpaCall, SdpaContext, TensorMeta

_CUDA0 = torch.device("cuda", 0)
_ALL = ("flash", "efficient", "math", "cudnn")


@pytest.fixture(autouse=True)
def _fresh_verdicts() -> Iterator[None]:
    fallback._cached.cache_clear()
    yield
    fallback._cached.cache_clear()


class _Checks:
    """Stand-ins for torch's three checks: they note what each was handed and answer as told."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answers: dict[str, str | None]) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answers = answers  # backend -> None (eligible) or the warning it gives
        cuda = torch.backends.cuda
        for name, attr in (("flash", "can_use_flash_attention"),
                           ("cudnn", "can_use_cudnn_attention"),
                           ("efficient", "can_use_efficient_attention")):
            monkeypatch.setattr(cuda, attr, self._check(name), raising=False)

    def _check(self, name: str) -> Any:
        def check(params: Any, debug: bool) -> bool:
            q, k, v, mask = params.query, params.key, params.value, params.attn_mask
            self.seen.append({
                "backend": name, "debug": debug,
                "devices": [t.device.type for t in (q, k, v)],
                "index": q.device.index,
                "mask_device": None if mask is None else mask.device.type,
                "shapes": [tuple(t.shape) for t in (q, k, v)],
                "last_strides": [t.stride(-1) for t in (q, k, v)],
                "dtype": q.dtype,
            })
            answer = self.answers[name]
            if answer is not None:
                warnings.warn(answer, UserWarning, stacklevel=1)
            return answer is None
        return check


def _cuda_summary(shape: tuple[int, ...], dtype: torch.dtype, *, mask: bool = False,
                  strides: tuple[int, int, int] = (1, 1, 1),
                  allowed: tuple[str, ...] = _ALL) -> SdpaCall:
    """What a profiled call holds of a CUDA SDPA call made inside it (the recorder's
    entry): shapes, dtype and device, the strides and the allowed backends; no tensor."""
    meta = TensorMeta(shape, dtype, _CUDA0)
    inner: list[tuple[str, Any]] = [("query", meta), ("key", meta), ("value", meta)]
    if mask:
        inner.append(("attn_mask", TensorMeta((shape[-2], shape[-2]), torch.bool, _CUDA0)))
    return SdpaCall(SdpaContext(strides, allowed), inner)


def _x(shape: tuple[int, ...], dtype: torch.dtype) -> list[tuple[str, Any]]:
    """The profiled call's own summary: its argument."""
    return [("x", TensorMeta(shape, dtype, _CUDA0))]


def test_the_checks_are_handed_the_calls_device_not_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    """An fp16 (1, 8, 128, 64) CUDA call that ran math: the checks get CUDA tensors of the call's
    shapes, dtype, strides and device index (they were meta before), so a fused backend can be
    named; the span says which, in torch's order."""
    checks = _Checks(monkeypatch, {"flash": "Flash attention does not support this mask",
                                   "cudnn": None, "efficient": None})
    shape = (1, 8, 128, 64)
    attrs: dict[str, Any] = {"attnscope.backend": "math"}
    fallback.annotate(attrs, _x(shape, torch.float16), "attn",
                      _cuda_summary(shape, torch.float16, mask=True, strides=(1, 1, 1)))
    assert [s["backend"] for s in checks.seen] == ["flash", "cudnn"]
    for seen in checks.seen:
        assert seen["debug"] is True
        assert seen["devices"] == ["cuda", "cuda", "cuda"] and seen["mask_device"] == "cuda"
        assert seen["index"] == 0
        assert seen["shapes"] == [shape] * 3 and seen["dtype"] == torch.float16
        assert seen["last_strides"] == [1, 1, 1]
    assert attrs["attnscope.backend.fallback"] is True
    assert attrs["attnscope.backend.expected"] == "cudnn"
    assert attrs["attnscope.backend.reason"] == "cudnn was eligible but the math kernel ran"


def test_a_fused_call_is_no_fallback_and_a_transposed_key_reaches_the_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel torch would pick ran: no fallback. A key whose last dimension is not packed
    reaches the checks with that stride (torch's flash and efficient checks read it)."""
    checks = _Checks(monkeypatch, {"flash": None, "cudnn": None, "efficient": None})
    attrs: dict[str, Any] = {"attnscope.backend": "flash"}
    fallback.annotate(attrs, _x((1, 8, 128, 64), torch.bfloat16), "attn",
                      _cuda_summary((1, 8, 128, 64), torch.bfloat16, strides=(1, 8, 1)))
    assert attrs["attnscope.backend.fallback"] is False
    (seen,) = checks.seen
    assert seen["last_strides"] == [1, 8, 1] and seen["dtype"] == torch.bfloat16


def test_shape_only_tensors_have_a_device_and_no_memory() -> None:
    """Made on a torch without CUDA, where any CUDA allocation, stream or runtime call raises: so
    making them touches none. They hold no storage, and any op asked of one fails loudly."""
    t = fallback._shape_only((2, 4, 16, 32), torch.float16, _CUDA0, last_stride=4)
    assert t.device == _CUDA0 and t.shape == (2, 4, 16, 32) and t.dtype == torch.float16
    assert t.stride() == (8192, 2048, 128, 4)
    assert not torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    with pytest.raises(RuntimeError):
        t.untyped_storage().data_ptr()  # a storage with no memory behind it
    with pytest.raises(RuntimeError, match="shape-only tensor"):
        torch.add(t, t)


def test_a_backend_off_when_the_worker_asks_is_not_called_ineligible(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's flags (``sdpa_kernel``) are process-wide and read when the worker asks, not when
    the call ran: a backend "runtime disabled" then, that the call's record does not show off
    for the call, leaves a math call unjudged rather than "no fused kernel was eligible"; one
    the call ran with off too is a reason like any other."""
    checks = _Checks(monkeypatch, {"flash": "Flash attention has been runtime disabled.",
                                   "cudnn": "cuDNN says no", "efficient": "efficient says no"})
    shapes = ((1, 2, 8, 64),) * 3
    assert assess("math", Inputs("cuda", shapes, torch.float16)) is None
    assert assess("math", Inputs("cuda", shapes, torch.float16, allowed=frozenset(_ALL))) is None
    assert assess("flash", Inputs("cuda", shapes, torch.float16)) == Verdict(False, "flash", "")
    off_for_the_call = Inputs("cuda", shapes, torch.float16,
                              allowed=frozenset({"math", "cudnn", "efficient"}))
    verdict = assess("math", off_for_the_call)
    assert verdict is not None and verdict.fallback and verdict.expected == ""
    assert verdict.reason.startswith("flash: Flash attention has been runtime disabled. | cudnn:")
    assert checks.seen


def test_the_calls_device_is_made_current_for_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks read the current device's properties (flash and cuDNN hang on its compute
    capability): a call on cuda:1 is judged with cuda:1 current, where CUDA is available."""
    _Checks(monkeypatch, {"flash": None, "cudnn": None, "efficient": None})
    entered: list[int] = []

    @contextlib.contextmanager
    def device(index: int) -> Iterator[None]:
        entered.append(index)
        yield

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", device)
    shapes = ((1, 2, 8, 64),) * 3
    assert assess("flash", Inputs("cuda", shapes, torch.float16, device_index=1)) is not None
    assert assess("flash", Inputs("cuda", shapes, torch.float16)) is not None  # index unknown
    assert entered == [1]


def test_a_torch_without_enable_gqa_in_its_params(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch before 2.5 builds ``SDPAParams`` from six arguments: a call without GQA is judged."""
    _Checks(monkeypatch, {"flash": None, "cudnn": None, "efficient": None})
    made: list[int] = []

    class SixArguments:
        def __init__(self, *args: Any) -> None:
            if len(args) != 6:
                raise TypeError("__init__(): incompatible constructor arguments")
            made.append(len(args))
            self.query, self.key, self.value, self.attn_mask = args[:4]

    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", SixArguments)
    shapes = ((1, 2, 8, 64),) * 3
    assert assess("math", Inputs("cuda", shapes, torch.float16)) == Verdict(
        True, "flash", "flash was eligible but the math kernel ran")
    assert made == [6]
