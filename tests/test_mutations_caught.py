"""Tests that catch wrong results the rest of the suite let pass (issue 10).

Each test names, in its docstring, the single-line mistake in attnscope it fails on.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from torch import nn

import attnscope
from attnscope._capture.sampling import CallSite, Sampler, decide
from attnscope._config import Config
from attnscope._record.capture import TIER_NONE, TIER_TIMING
from attnscope._worker import loop as _loop
from attnscope.testing import capture_spans

# ---- 1. instrument() FLOPs with a value head size different from the key head size ------------


def test_instrument_flops_use_the_value_head_size_of_a_registered_layer() -> None:
    """Catches instrument() FLOPs computed with the q/k head size for PV too (Dv ignored, as if
    every layer had Dv == Dqk): an MLA-like layer with Dqk=8, Dv=12 must count (8 + 12) per pair."""

    class Mla(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            w = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
            return w @ v

    def extract(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        q, k, v = args
        return {"batch": q.shape[0], "seq_q": q.shape[2], "seq_kv": k.shape[2],
                "heads": q.shape[1], "kv_heads": k.shape[1],
                "head_dim": q.shape[3], "head_dim_v": v.shape[3]}

    attnscope.register_attention(Mla, extract)
    model = nn.Sequential(Mla())
    attnscope.instrument(model)
    b, h, sq, skv, dqk, dv = 3, 2, 4, 6, 8, 12
    q, k, v = torch.randn(b, h, sq, dqk), torch.randn(b, h, skv, dqk), torch.randn(b, h, skv, dv)
    with capture_spans() as spans:
        out = model[0](q, k, v)
    attnscope.uninstrument(model)
    assert out.shape == (b, h, sq, dv)
    (a,) = [s.attributes for s in spans]
    assert a["attnscope.head_dim"] == dqk
    assert a["attnscope.flops"] == 2 * b * h * sq * skv * (dqk + dv)


def test_instrument_flops_of_deepseek_v3_mla_use_v_head_dim() -> None:
    """Catches instrument() FLOPs on a real MLA model (DeepseekV3, qk head 12, v head 6) counted
    with the q/k head size for PV as well."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DeepseekV3Config"):
        pytest.skip("this transformers has no DeepseekV3")
    nope, rope, dv, heads = 8, 4, 6, 4
    cfg = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=nope,
        qk_rope_head_dim=rope, v_head_dim=dv, max_position_embeddings=64,
        attn_implementation="eager", pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    attnscope.instrument(model)
    assert len(attnscope.instrumented_modules(model)) == 1
    b, s = 2, 5
    ids = torch.randint(1, 64, (b, s))
    with capture_spans() as spans, torch.no_grad():
        model(ids, use_cache=False)
    attnscope.uninstrument(model)
    (a,) = [x.attributes for x in spans]
    assert a["attnscope.head_dim"] == nope + rope and a["attnscope.causal"] is True
    pairs = s * (s + 1) // 2  # causal
    assert a["attnscope.flops"] == 2 * b * heads * pairs * ((nope + rope) + dv)


# ---- 2. nn.MultiheadAttention key_padding_mask polarity ----------------------------------------

# batch 2, seq 8: row 0 pads its last 3 tokens, row 1 none. Real tokens: 5 + 8 = 13; read with
# the polarity inverted: 3 + 0 = 3.
_PAD = torch.tensor([[False] * 5 + [True] * 3, [False] * 8])
_REAL = 13


def _mha_tokens(mask: torch.Tensor, raises: type[BaseException] | None = None) -> Any:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    attnscope.instrument(mha)
    x = torch.randn(2, 8, 16)
    with capture_spans() as spans, torch.no_grad():
        if raises is None:
            mha(x, x, x, key_padding_mask=mask, need_weights=False)
        else:
            with pytest.raises(raises):
                mha(x, x, x, key_padding_mask=mask, need_weights=False)
    attnscope.uninstrument(mha)
    (a,) = [s.attributes for s in spans]
    assert a["attnscope.module_class"] == "MultiheadAttention" and a["attnscope.batch_size"] == 2
    return a["attnscope.tokens"]


def test_multihead_bool_key_padding_mask_true_means_padding() -> None:
    """Catches a boolean key_padding_mask read with inverted polarity (True taken as "attend"):
    with 3 of 16 positions padded the span must say 13 tokens, not 3."""
    assert _mha_tokens(_PAD) == _REAL


def test_multihead_float_key_padding_mask_minus_inf_means_padding() -> None:
    """Catches an additive (-inf = padding, 0 = real) key_padding_mask counted the wrong way round
    or as "nonzero = real": the span must say 13 tokens."""
    mask = torch.zeros(2, 8).masked_fill(_PAD, float("-inf"))
    assert _mha_tokens(mask) == _REAL


def test_multihead_integer_key_padding_mask_one_means_padding() -> None:
    """Catches an integer (0/1) key_padding_mask read as "1 = real", as the 2-D padding masks of
    the other layers are. torch itself refuses integer masks here, so the call fails (the user's
    error propagates), but the span attnscope reports for it still counts 13 real tokens."""
    assert _mha_tokens(_PAD.long(), raises=AssertionError) == _REAL


# ---- 3. Jaeger JSON FOLLOWS_FROM references ------------------------------------------------------


def test_jaeger_json_keeps_the_link_of_a_forced_capture_as_follows_from(tmp_path: Path) -> None:
    """Catches the Jaeger JSON exporter dropping span links: a forced capture inside a trace the
    app did not record starts its own trace linked to the app's span, and the file must carry
    that link as a FOLLOWS_FROM reference with the app span's ids."""

    @attnscope.trace
    def traced(x: int) -> int:
        return x + 1

    path = tmp_path / "trace.json"
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=0.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0, metrics=False)
    app = TracerProvider(sampler=ALWAYS_OFF).get_tracer("app")
    with app.start_as_current_span("dropped") as app_span, attnscope.sampling(force=True):
        assert traced(1) == 2
    app_ctx = app_span.get_span_context()
    assert app_ctx.is_valid and not app_ctx.trace_flags.sampled
    assert attnscope.shutdown(timeout_s=10)
    doc = json.loads(path.read_text(encoding="utf-8"))
    spans = [s for t in doc["data"] for s in t["spans"]]
    (span,) = [s for s in spans if s["operationName"].endswith("traced")]
    assert span["traceID"] != f"{app_ctx.trace_id:032x}"  # its own trace: no CHILD_OF
    assert span["references"] == [{
        "refType": "FOLLOWS_FROM",
        "traceID": f"{app_ctx.trace_id:032x}",
        "spanID": f"{app_ctx.span_id:016x}",
    }]


# ---- 4. children of a parent dropped on a full queue -------------------------------------------


def test_children_of_a_parent_dropped_on_a_full_queue_are_reparented_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Catches the children of a capture dropped on a full queue left waiting for it (pending
    forever, never emitted): they must be built one level up, counted in stats()["orphaned"], and
    emitted + dropped_queue_full must equal captured."""
    gate = threading.Event()
    original = _loop.Worker._step

    def stalled_step(self: _loop.Worker) -> bool:
        gate.wait(10)
        return original(self)

    monkeypatch.setattr(_loop.Worker, "_step", stalled_step)

    @attnscope.trace
    def inner(x: int) -> int:
        return x * 2

    @attnscope.trace
    def outer(x: int) -> int:
        return inner(x) + inner(x + 1)  # both inner captures fill the queue; outer's is dropped

    with capture_spans(queue_size=2) as spans:
        try:
            assert outer(1) == 6
        finally:
            gate.set()
        attnscope.flush(timeout_s=5)
        stats = attnscope.stats()
    assert stats["captured"] == 3 and stats["dropped_queue_full"] == 1
    assert stats["orphaned"] == 2 and stats["pending"] == 0
    assert stats["emitted"] + stats["dropped_queue_full"] == stats["captured"]
    assert sorted(s.name.rsplit(".", 1)[-1] for s in spans) == ["inner", "inner"]
    assert all(s.parent is None for s in spans)  # no app span: re-parented to the root


def test_flush_waits_until_a_dropped_parents_children_are_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Catches a flush() that returns True while a dropped capture's notice still waits for the
    worker (it arrived after the step that built the child): the child would still be pending
    after the flush (seen under load: stats()["pending"] 6 and 10 after flush() returned True)."""
    gate = threading.Event()
    original = _loop.Worker._step
    held_once: list[bool] = []

    def late_notices(self: _loop.Worker) -> bool:
        gate.wait(10)
        if not self.dropped_ids or held_once:
            return original(self)
        held_once.append(True)
        held = list(self.dropped_ids)
        self.dropped_ids.clear()
        worked = original(self)  # builds the child: its parent is not known yet
        threading.Timer(0.5, self.dropped_ids.extend, args=(held,)).start()  # the notice, late
        return worked

    monkeypatch.setattr(_loop.Worker, "_step", late_notices)

    @attnscope.trace
    def inner(x: int) -> int:
        return x * 2

    @attnscope.trace
    def outer(x: int) -> int:
        return inner(x)  # inner's capture fills the queue of one; outer's is dropped

    with capture_spans(queue_size=1):
        try:
            assert outer(1) == 2
        finally:
            gate.set()
        assert attnscope.flush(timeout_s=10)
        stats = attnscope.stats()
    assert held_once, "the scenario did not happen"
    assert stats["captured"] == 2 and stats["dropped_queue_full"] == 1
    assert stats["pending"] == 0 and stats["orphaned"] == 1, stats


# ---- 5. warm-up while another context holds sampling(force=True) ------------------------------


def test_warmup_is_exact_while_another_context_forces_sampling() -> None:
    """Catches warm-up off by one on the per-call path taken while a forced block is open
    elsewhere: with warmup_calls=W exactly the first W calls are skipped and call W+1 is sampled
    (not W calls sampled from call W on)."""
    warmup = 4
    s = Sampler()
    s.apply(Config(sample_rate=1.0, warmup_calls=warmup, overhead_budget=1.0, profile_rate=0.0))
    site = CallSite("w", "w")
    s.register(site)
    block = object()
    s.force_enter(block)  # a forced block in another context: this context's force var is unset
    try:
        tiers = []
        for _ in range(warmup + 3):
            site.countdown -= 1
            if site.countdown > 0:
                tiers.append(TIER_NONE)
                continue
            tiers.append(decide(s, site)[0])
    finally:
        s.force_exit(block)
    assert tiers == [TIER_NONE] * warmup + [TIER_TIMING] * 3


def test_warmup_is_exact_while_another_thread_holds_a_forced_block() -> None:
    """Same off-by-one, end to end: one thread sits in attnscope.sampling(force=True) while this
    thread makes W + 1 calls with warmup_calls=W and sample_rate=1.0: exactly one span
    (call W+1)."""
    warmup = 5

    @attnscope.trace
    def f(x: int) -> int:
        return x

    inside, release = threading.Event(), threading.Event()

    def debug_request() -> None:
        with attnscope.sampling(force=True):
            inside.set()
            release.wait(10)

    with capture_spans(sample_rate=1.0, warmup_calls=warmup) as spans:
        t = threading.Thread(target=debug_request)
        t.start()
        try:
            assert inside.wait(10)
            counts = []
            for i in range(warmup + 1):
                f(i)
                attnscope.flush(timeout_s=5)
                counts.append(attnscope.stats().get("captured", 0))
        finally:
            release.set()
            t.join(10)
    assert counts == [0] * warmup + [1]
    assert len(spans) == 1


def test_a_child_behind_thousands_of_spans_still_finds_its_parent_dropped() -> None:
    """Catches a drop notice forgotten before the child it settles reaches the builder: the
    notice is applied when the worker wakes, the child may sit behind a long queue, and the
    built spans in between (more than the builder keeps of them) pushed the notice out, so the
    child waited 10 minutes for its parent (stats()["pending"] > 0 after a flush that said
    True; seen in tests/reliability/test_concurrency.py under load)."""
    from types import SimpleNamespace

    from attnscope._record.capture import Capture
    from attnscope._spans.emit import Emitter
    from attnscope._spans.spans import Result, SpanBuilder

    class Counting(Emitter):
        def emit(self, *args: object, **kwargs: object) -> None:
            return None

    def result(capture_id: int, parent_id: int | None) -> Result:
        cap = Capture()
        cap.capture_id, cap.parent_id, cap.name = capture_id, parent_id, "c"
        cap.site = SimpleNamespace(attributes={})
        return Result(cap, {}, [])

    builder = SpanBuilder(Counting(), 10**9)
    builder.parent_dropped(1)  # the parent's notice, applied first
    for i in range(10, 10_010):  # the spans queued between them
        builder.add(result(i, None))
    builder.add(result(2, 1))  # the child, at last
    assert builder.pending() == 0 and builder.stats.orphaned == 1
