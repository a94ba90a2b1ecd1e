"""Two models with the same module paths in one process — a model and the assistant model of its
assisted generation: the report keeps their rows apart, each against the spans' own counts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import attnscope
from attnscope.cli.report import run_report
from attnscope.cli.traces import SpanRow, _models_apart, group_key

transformers = pytest.importorskip("transformers")


def _llama(hidden: int, layers: int) -> Any:
    torch.manual_seed(hidden)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_an_assistant_models_layers_are_rows_of_their_own(tmp_path: Path,
                                                          capsys: Any) -> None:
    trace, report = tmp_path / "t.json", tmp_path / "r.json"
    target, draft = _llama(64, 2), _llama(32, 1)
    attnscope.configure(exporter=f"jaeger-json:{trace}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    attnscope.instrument(target, trace_model=True)
    attnscope.instrument(draft, trace_model=True)
    try:
        with torch.no_grad():
            target.generate(input_ids=torch.randint(1, 64, (1, 8)), max_new_tokens=6,
                            do_sample=False, assistant_model=draft)
    finally:
        assert attnscope.shutdown(timeout_s=30)
    # the spans' own counts: attention calls per (layer, phase), the draft's apart
    want: Counter[tuple[str, str]] = Counter()
    for t in json.loads(trace.read_text())["data"]:
        for s in t["spans"]:
            tags = {x["key"]: x["value"] for x in s["tags"]}
            if "attnscope.num_heads" not in tags:
                continue
            module = tags["attnscope.module"]
            if tags.get("attnscope.model.instance") == 2:
                module += " (LlamaForCausalLM #2)"
            want[(module, tags["attnscope.phase"])] += 1
    assert {m for m, _ in want} == {"model.layers.0.self_attn", "model.layers.1.self_attn",
                                    "model.layers.0.self_attn (LlamaForCausalLM #2)"}
    assert run_report(trace, json_path=str(report)) == 0
    text = capsys.readouterr().out
    doc = json.loads(report.read_text())
    got = Counter({(g["module"], g["phase"]): g["calls"] for g in doc["groups"]})
    assert got == want
    generates = {g["name"]: g["calls"] for g in doc["end_to_end"]["generate"]}
    assert generates["LlamaForCausalLM.generate"] == 1  # the user's call
    assert generates["LlamaForCausalLM.generate #2"] >= 1  # the assistant's, one per round
    assert "model.layers.0.self_attn (LlamaForCausalLM #2)" in text


def test_a_second_model_with_paths_of_its_own_keeps_plain_labels(tmp_path: Path) -> None:
    trace, report = tmp_path / "t.json", tmp_path / "r.json"
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64)).eval()
    llama = _llama(32, 1)
    attnscope.configure(exporter=f"jaeger-json:{trace}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    attnscope.instrument(gpt2, trace_model=True)
    attnscope.instrument(llama, trace_model=True)  # the second: its spans carry its number
    try:
        with torch.no_grad():
            ids = torch.randint(1, 64, (1, 8))
            gpt2(ids)
            llama(ids)
    finally:
        assert attnscope.shutdown(timeout_s=30)
    numbered = [s for t in json.loads(trace.read_text())["data"] for s in t["spans"]
                if any(x["key"] == "attnscope.model.instance" for x in s["tags"])]
    assert numbered == []  # no path of the second is the first's: nothing to tell apart
    assert run_report(trace, json_path=str(report)) == 0
    modules = {g["module"] for g in json.loads(report.read_text())["groups"]}
    assert modules == {"transformer.h.0.attn", "model.layers.0.self_attn"}


def _row(span_id: str, module: str, pid: int, number: int | None) -> SpanRow:
    attrs: dict[str, Any] = {"attnscope.tier": "timing", "attnscope.module": module}
    if number is not None:
        attrs |= {"attnscope.model": "LlamaForCausalLM", "attnscope.model.instance": number}
    return SpanRow("t" * 32, span_id, None, module, 0, 1, attrs, "svc", {"process.pid": pid})


def test_a_models_number_is_read_only_where_its_process_shares_the_path() -> None:
    # process 1: the first model and a numbered second with the same path; process 2 (another
    # file of the run): the numbered model alone
    rows = [_row("a", "model.layers.0.self_attn", 1, None),
            _row("b", "model.layers.0.self_attn", 1, 2),
            _row("c", "model.layers.0.self_attn", 2, 2)]
    got = {r.span_id: group_key(r)[0] for r in _models_apart(rows)}
    assert got == {"a": "model.layers.0.self_attn",
                   "b": "model.layers.0.self_attn (LlamaForCausalLM #2)",
                   "c": "model.layers.0.self_attn"}
