"""Instrumentation of whole models, with one module per library it knows.

``model`` is ``instrument()`` / ``uninstrument()`` / ``register_attention()``, over ``selection``
(which modules of a model are attention layers) and ``patching`` (how one module is wrapped and
restored); ``facts`` reads head counts the same way for every library (what a model family's
layers differ by is read by its module in ``_attention.families``); ``torch_nn`` handles
``nn.MultiheadAttention``; ``transformers`` recognises Hugging Face (and look-alike) attention
modules by their structure; ``sdpa`` wraps ``torch.nn.functional.scaled_dot_product_attention``.
None of them imports ``transformers``: modules are recognised by their attributes, so it stays an
optional extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._record.facts import Facts

__all__ = ["Extractor"]

# Runs on the calling thread of a sampled call: (module, args incl. the module, kwargs) -> the
# call's facts, None when it recognises nothing (the arguments' shapes are summarised instead).
# Must read shapes and ints only: no tensor values, no device synchronisation.
Extractor = Callable[[Any, tuple[Any, ...], dict[str, Any]], Facts | None]
