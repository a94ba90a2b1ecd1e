"""Whether ``torch.autocast`` is on for a sampled call's device, and with which dtype: float32
inputs' matmuls and SDPA then run in that dtype (the layer's hidden states stay float32), so
the roofline's peak is that dtype's, not float32's (on an H100, about 990 dense bf16 TFLOP/s
against 67 for float32)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ANY_ON", "dtype_for"]


def _any_on_fallback() -> bool:
    return bool(torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"))


# one C call (~70 ns) where torch has it: the only cost to a call with autocast off
ANY_ON: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", _any_on_fallback)


def dtype_for(device: Any) -> str | None:
    """Autocast's dtype for ``device``'s type (a host call when no tensor said), without
    ``torch.``; None when autocast is off there."""
    kind = device.type if device is not None else "cpu"
    try:
        if not torch.is_autocast_enabled(kind):
            return None
        return str(torch.get_autocast_dtype(kind)).removeprefix("torch.")
    except Exception:  # noqa: BLE001  (a device type autocast does not know)
        return None
