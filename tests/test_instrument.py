"""attnscope.instrument on plain PyTorch modules: discovery, wrappers, restore, safety, compile."""

from __future__ import annotations

import copy
import functools
import io
import pickle
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

import attnscope
from attnscope import instrumented_modules
from attnscope._derive import call as _inspect
from attnscope.testing import capture_spans


class TinyAttention(nn.Module):
    """A look-alike of a transformers attention layer (structural detection, no transformers)."""

    def __init__(
        self, width: int = 16, heads: int = 4, kv_heads: int = 2, causal: bool = True
    ) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads = heads, kv_heads
        self.head_dim = width // heads
        self.is_causal = causal
        self.q_proj = nn.Linear(width, heads * self.head_dim)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim)
        self.o_proj = nn.Linear(heads * self.head_dim, width)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, self.num_heads, -1).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, s, self.num_key_value_heads, -1).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, s, self.num_key_value_heads, -1).transpose(1, 2)
        rep = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class TinyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = TinyAttention()
        self.mlp = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x + self.self_attn(x))


class TinyModel(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList([TinyBlock() for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_one_span_per_layer_with_path_index_class_and_exact_flops() -> None:
    torch.manual_seed(0)
    model = TinyModel()
    x = torch.randn(2, 5, 16)
    assert attnscope.instrument(model) is model
    assert instrumented_modules(model) == [f"layers.{i}.self_attn" for i in range(3)]
    with capture_spans() as spans:
        model(x)
    assert sorted(s.name for s in spans) == [f"layers.{i}.self_attn" for i in range(3)]
    for s in spans:
        a = s.attributes
        assert a["attnscope.module"] == s.name
        assert a["attnscope.layer_index"] == int(s.name.split(".")[1])
        assert a["attnscope.module_class"] == "TinyAttention"
        assert (a["attnscope.num_heads"], a["attnscope.num_kv_heads"], a["attnscope.head_dim"]) == (
            4,
            2,
            4,
        )
        assert a["attnscope.tokens"] == 10 and a["attnscope.causal"] is True
        # brute force: every (b, h, i, j) pair the causal mask leaves visible costs 2·(D + Dv)
        pairs = sum(
            1 for _ in range(2) for _ in range(4) for i in range(5) for j in range(5) if j <= i
        )
        assert a["attnscope.flops"] == pairs * 2 * (4 + 4)
    attnscope.uninstrument(model)


def test_uninstrument_restores_forwards_hooks_state_and_outputs_bit_for_bit() -> None:
    torch.manual_seed(0)
    model = TinyModel()
    hook = model.layers[0].self_attn.register_forward_hook(lambda m, i, o: None)
    x = torch.randn(2, 5, 16)
    before = model(x)
    dicts = {n: dict(m.__dict__) for n, m in model.named_modules()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attnscope.instrument(model, trace_model=True)
    with capture_spans():
        during = model(x)
    attnscope.uninstrument(model)
    assert instrumented_modules(model) == []
    for n, m in model.named_modules():
        assert m.__dict__.keys() == dicts[n].keys(), n
        assert m._forward_hooks == dicts[n]["_forward_hooks"]
    assert list(model.layers[0].self_attn._forward_hooks) == [hook.id]
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    after = model(x)
    assert torch.equal(before, during) and torch.equal(before, after)


def test_instrument_twice_keeps_one_wrapper_and_warns_once() -> None:
    model = TinyModel(1)
    attnscope.instrument(model)
    wrapper = model.layers[0].self_attn.forward
    with pytest.warns(UserWarning, match="already instrumented") as record:
        attnscope.instrument(model)
    assert len(record) == 1
    assert model.layers[0].self_attn.forward.__func__ is wrapper.__func__
    with capture_spans() as spans:
        model(torch.randn(1, 3, 16))
    assert len(spans) == 1
    attnscope.uninstrument(model)
    assert "forward" not in model.layers[0].self_attn.__dict__


def test_include_exclude_and_name_prefix() -> None:
    model = TinyModel(3)
    attnscope.instrument(
        model, include="layers.*.self_attn", exclude=["layers.1.*"], name_prefix="enc"
    )
    assert instrumented_modules(model) == ["layers.0.self_attn", "layers.2.self_attn"]
    with capture_spans() as spans:
        model(torch.randn(1, 2, 16))
    assert sorted(s.name for s in spans) == ["enc.layers.0.self_attn", "enc.layers.2.self_attn"]
    attnscope.uninstrument(model)


def test_existing_instance_forward_is_wrapped_and_restored() -> None:
    model = TinyModel(1)
    attn = model.layers[0].self_attn
    original = attn.forward
    calls: list[int] = []

    def patched(hidden_states: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return original(hidden_states)

    attn.forward = patched  # type: ignore[method-assign]
    keys = set(attn.__dict__)
    attnscope.instrument(model)
    with capture_spans() as spans:
        model(torch.randn(1, 3, 16))
    assert calls == [1] and len(spans) == 1 and spans[0].attributes["attnscope.tokens"] == 3
    # named after the class's forward, not after the adapter that calls the instance's one
    assert spans[0].attributes["code.function.name"] == f"{type(attn).__qualname__}.forward"
    attnscope.uninstrument(model)
    assert attn.__dict__["forward"] is patched and set(attn.__dict__) == keys


def test_accelerate_style_hook_forward_survives_deepcopy() -> None:
    # accelerate's add_hook_to_module sets forward = update_wrapper(partial(new_forward, module))
    def new_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return module._old_forward(*args, **kwargs) + 1.0

    torch.manual_seed(0)
    model = TinyModel(1)
    attn = model.layers[0].self_attn
    attn._old_forward = attn.forward
    attn.forward = functools.update_wrapper(  # type: ignore[method-assign]
        functools.partial(new_forward, attn), attn._old_forward
    )
    x = torch.randn(1, 3, 16)
    ref = model(x)
    attnscope.instrument(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.layers[0].self_attn.o_proj.weight.zero_()
    with capture_spans() as spans:
        assert torch.equal(model(x), ref)
        twin_out = twin(x)
    assert not torch.equal(twin_out, ref)  # the copy's hook calls the copy's forward
    assert len(spans) == 2 and {s.attributes["attnscope.tokens"] for s in spans} == {3}
    attnscope.uninstrument(model)
    assert isinstance(attn.__dict__["forward"], functools.partial)
    assert torch.equal(model(x), ref)


def test_not_sampled_calls_pass_through_and_user_errors_propagate() -> None:
    model = TinyModel(2)
    attnscope.instrument(model)
    x = torch.randn(1, 4, 16)
    with capture_spans(sample_rate=0.0) as spans:
        out = model(x)
    assert spans == [] and out.shape == x.shape
    with capture_spans() as spans, pytest.raises(RuntimeError) as info:
        model(torch.randn(1, 4, 7))  # wrong width: the user's own error
    assert "mat1 and mat2" in str(info.value)
    assert spans and spans[0].status.status_code.name == "ERROR"
    attnscope.uninstrument(model)


@pytest.mark.internal_errors("extract")
def test_extractor_errors_are_internal_and_the_call_proceeds() -> None:
    from attnscope import _log

    class Weird(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    def broken(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise ValueError("boom")

    attnscope.register_attention(Weird, broken)
    m = Weird()
    attnscope.instrument(m)
    with capture_spans() as spans:
        for _ in range(7):
            assert torch.equal(m(torch.ones(2)), torch.full((2,), 2.0))
        errors = _log.error_count("extract")
    # the first calls still get a span (without attention facts); then the site switches itself off
    assert errors == 5 and len(spans) == 5
    assert all("attnscope.flops" not in s.attributes for s in spans)
    attnscope.uninstrument(m)


def test_register_attention_with_and_without_extractor() -> None:
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n_heads, self.head_dim = 2, 8

        def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return q

    def extract(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        q, k = args
        return {"batch": q.shape[0], "seq_q": q.shape[1], "seq_kv": k.shape[1]}

    attnscope.register_attention(Custom, extract)
    wrapper = nn.Sequential(Custom())
    attnscope.instrument(wrapper)
    with capture_spans() as spans:
        wrapper[0](torch.randn(3, 4, 16), torch.randn(3, 6, 16))
    (a,) = [s.attributes for s in spans]
    assert a["attnscope.module"] == "0" and a["attnscope.layer_index"] == 0
    assert a["attnscope.flops"] == _inspect.attention_flops(3, 2, 4, 6, 8)
    attnscope.uninstrument(wrapper)
    with pytest.raises(TypeError):
        attnscope.register_attention(int)


def test_multihead_attention_and_transformer_encoder() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0)
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    src = torch.randn(6, 2, 16)  # (S, B, E): batch_first=False
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # True = padding
    with torch.no_grad():
        ref = enc(src, src_key_padding_mask=pad)
    attnscope.instrument(enc)
    assert instrumented_modules(enc) == ["layers.0.self_attn", "layers.1.self_attn"]
    with capture_spans() as spans, torch.no_grad():
        out = enc(src, src_key_padding_mask=pad)
    assert sorted(s.name for s in spans) == ["layers.0.self_attn", "layers.1.self_attn"]
    for s in spans:
        a = s.attributes
        assert a["attnscope.module_class"] == "MultiheadAttention"
        assert a["attnscope.batch_size"] == 2 and a["attnscope.seq_len_q"] == 6
        assert a["attnscope.tokens"] == 10 and a["attnscope.causal"] is False
        assert a["attnscope.flops"] == 2 * 2 * 4 * 6 * 6 * (4 + 4)
    attnscope.uninstrument(enc)
    with torch.no_grad():
        assert torch.equal(out, ref) and torch.equal(enc(src, src_key_padding_mask=pad), ref)


def test_causal_encoder_and_batch_first_mha() -> None:
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    attnscope.instrument(mha)
    x = torch.randn(3, 5, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    with capture_spans() as spans:
        mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
        mha(x, torch.randn(3, 7, 16), torch.randn(3, 7, 16))
    by_kv = {s.attributes["attnscope.seq_len_kv"]: s.attributes for s in spans}
    assert spans[0].name == "MultiheadAttention"
    assert by_kv[5]["attnscope.flops"] == 2 * 3 * 2 * 15 * (8 + 8)
    assert by_kv[7]["attnscope.flops"] == 2 * 3 * 2 * 5 * 7 * (8 + 8)
    assert by_kv[7]["attnscope.tokens"] == 15
    attnscope.uninstrument(mha)


def test_deepcopy_rebinds_and_pickles_stay_safe() -> None:
    torch.manual_seed(0)
    model = TinyModel(1)
    attnscope.instrument(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.layers[0].self_attn.o_proj.weight.add_(1.0)
    x = torch.randn(1, 3, 16)
    assert not torch.equal(twin(x), model(x))  # the copy computes with its own weights
    assert instrumented_modules(twin) == ["layers.0.self_attn"]
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    assert set(torch.load(io.BytesIO(buf.getvalue()))) == set(model.state_dict())
    clone = pickle.loads(pickle.dumps(model))  # unpickles uninstrumented, computing the same
    assert torch.equal(clone(x), model(x)) and instrumented_modules(clone) == []
    attnscope.uninstrument(model)
    attnscope.uninstrument(twin)


def test_to_eval_no_grad_inference_mode_and_training() -> None:
    model = TinyModel(2)
    attnscope.instrument(model)
    model.to(torch.float64).eval()
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    with capture_spans() as spans:
        with torch.no_grad():
            model(x)
        with torch.inference_mode():
            model(x)
        model.train()
        model(x).sum().backward()  # backward is not traced
    assert len(spans) == 6
    assert {s.attributes["attnscope.dtype"] for s in spans} == {"float64"}
    attnscope.uninstrument(model)


def test_torch_compile_after_instrument_inlines_the_original() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = TinyModel(2)
    x = torch.randn(1, 4, 16)
    ref = model(x)
    attnscope.instrument(model)
    compiled = torch.compile(model, backend="eager")
    with capture_spans(sample_rate=0.5) as spans:
        outs = [compiled(x) for _ in range(20)]
    assert all(torch.allclose(o, ref) for o in outs)
    assert counters["stats"]["unique_graphs"] <= 2
    assert not counters["recompiles"]
    assert spans == []  # compiled calls are not traced (documented)
    with capture_spans() as spans:
        model(x)  # the eager module is still traced
    assert len(spans) == 2
    attnscope.uninstrument(model)
    torch._dynamo.reset()


def test_sdpa_instrument_and_restore() -> None:
    original = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(2, 4, 6, 8)
    k = v = torch.randn(2, 2, 9, 8)
    attnscope.instrument_sdpa()
    try:
        with pytest.warns(UserWarning, match="already instrumented"):
            attnscope.instrument_sdpa()
        with capture_spans() as spans:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True
            )
    finally:
        attnscope.uninstrument_sdpa()
    assert torch.nn.functional.scaled_dot_product_attention is original
    assert torch.equal(out, original(q, k, v, is_causal=True, enable_gqa=True))
    (a,) = [s.attributes for s in spans]
    assert a["attnscope.flops"] == _inspect.attention_flops(2, 4, 6, 9, 8, causal=True)
    assert a["attnscope.num_kv_heads"] == 2


def test_window_pairs_brute_force() -> None:
    for sq, skv, w in [(4, 4, 2), (1, 9, 3), (5, 9, 4), (3, 3, 10), (6, 10, 1)]:
        brute = sum(
            1 for i in range(sq) for j in range(skv) if j <= i + skv - sq and i + skv - sq - j < w
        )
        assert _inspect.window_pairs(sq, skv, w) == brute


def test_attnscope_does_not_import_transformers() -> None:
    code = (
        "import sys, attnscope, torch; m = torch.nn.Transformer(d_model=8, nhead=2, "
        "num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8); attnscope.instrument(m); "
        "assert 'transformers' not in sys.modules, 'imported'; print(len("
        "attnscope.instrumented_modules(m)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"


def test_instrumenting_a_compiled_module_instruments_the_module_it_wraps() -> None:
    model = TinyModel(1)
    compiled = torch.compile(model, backend="eager")
    assert attnscope.instrument(compiled) is compiled
    assert instrumented_modules(model) == ["layers.0.self_attn"]
    # the compiled wrapper names them as the spans do, not "_orig_mod.layers.0.self_attn"
    assert instrumented_modules(compiled) == ["layers.0.self_attn"]
    with capture_spans() as spans:
        model(torch.randn(1, 3, 16))
    assert [s.name for s in spans] == ["layers.0.self_attn"]
    attnscope.uninstrument(compiled)
    assert instrumented_modules(model) == instrumented_modules(compiled) == []


def test_compile_in_a_fresh_process_where_dynamo_loads_after_instrument() -> None:
    # Wrappers wait for torch._dynamo to be imported before registering with it; the first
    # torch.compile must already see them registered (no graph break, no recompiles).
    code = """
import sys, torch, attnscope
from torch import nn
class A(nn.Module):
    def __init__(s):
        super().__init__()
        s.num_heads, s.head_dim = 2, 4
        s.q_proj, s.k_proj, s.v_proj = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
    def forward(s, hidden_states):
        return s.q_proj(hidden_states) * s.k_proj(hidden_states) + s.v_proj(hidden_states)
m = nn.Sequential(A(), A())
attnscope.configure(sample_rate=0.3, warmup_calls=0, exporter="none", profile_rate=0.0)
attnscope.instrument(m)
attnscope.instrument_sdpa()
assert "torch._dynamo" not in sys.modules
c = torch.compile(m, backend="eager")
x = torch.randn(1, 3, 8)
for _ in range(20):
    c(x)
from torch._dynamo.utils import counters
print(counters["stats"]["unique_graphs"], len(counters["graph_break"]), len(counters["recompiles"]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "0", "0"]
