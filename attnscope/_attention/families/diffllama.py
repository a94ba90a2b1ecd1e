"""DiffLlama's differential attention: two attention cores over the same queries and keys.

Detector: the learned ``lambda_q1``/``lambda_k1`` and ``lambda_init`` of
``softmax_1 - λ·softmax_2``. Rule: one map per core, each over all the queries and keys (with
half of V doubled back to the heads), so twice the plain layer's FLOPs; the least traffic of two
cores is no one kernel's: not established.
"""

from __future__ import annotations

from typing import Any

from .base import Family

__all__ = ["FAMILY", "attention_cores", "cores_flops"]


def attention_cores(module: Any) -> int:
    """How many attention cores one call runs: 2 for differential attention (DiffLlama: the
    learned ``lambda_q1``/``lambda_k1`` and ``lambda_init`` of ``softmax_1 - λ·softmax_2``, each
    map over all of Q and K with half of V doubled back to the heads), else 1."""
    params = getattr(module, "_parameters", {})
    differential = "lambda_q1" in params and "lambda_k1" in params and isinstance(
        vars(module).get("lambda_init"), (int, float))
    return 2 if differential else 1


def cores_flops(flops: int, cores: int) -> int:
    """One core's FLOPs for all of the layer's cores."""
    return flops * cores


FAMILY = Family("DiffLlama differential attention", ("diffllama",), attention_cores, "cores")
