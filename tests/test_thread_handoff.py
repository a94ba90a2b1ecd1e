"""``generate()`` handed to another thread, as a streaming server does with
``TextIteratorStreamer``: its attention calls are in the request's block only when the thread
starts with the block's context; the report counts those it finds in none while a block was open
(against the spans' own parent links)."""

from __future__ import annotations

import contextvars
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import attnscope
from attnscope.cli.report import run_report

transformers = pytest.importorskip("transformers")


class _Ids:
    """The streamer's tokenizer: token ids as text (no vocabulary needed)."""

    def decode(self, ids: Any, **_: Any) -> str:
        return " ".join(str(int(i)) for i in ids)


def _llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return transformers.LlamaForCausalLM(cfg).eval()


def _serve(path: Path, with_context: bool) -> None:
    model = _llama()
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    attnscope.instrument(model)
    try:
        for i in range(2):
            with attnscope.span("request", attributes={"n": i}), torch.no_grad():
                streamer = transformers.TextIteratorStreamer(_Ids())
                kwargs = {"input_ids": torch.randint(1, 64, (1, 6)), "max_new_tokens": 3,
                          "streamer": streamer, "do_sample": False}
                if with_context:
                    thread = threading.Thread(target=contextvars.copy_context().run,
                                              args=(model.generate,), kwargs=kwargs)
                else:
                    thread = threading.Thread(target=model.generate, kwargs=kwargs)
                thread.start()
                assert "".join(streamer)  # the request reads the tokens as they come
                thread.join()
    finally:
        attnscope.uninstrument(model)
        assert attnscope.shutdown(timeout_s=30.0)


def _in_requests(path: Path) -> tuple[int, int]:
    """(attention calls under a request span, attention calls under none), from the file."""
    spans = [s for t in json.loads(path.read_text())["data"] for s in t["spans"]]
    parent = {s["spanID"]: next((r["spanID"] for r in s.get("references", ())
                                 if r["refType"] == "CHILD_OF"), None) for s in spans}
    requests = {s["spanID"] for s in spans if s["operationName"] == "request"}
    assert len(requests) == 2
    inside = outside = 0
    for s in spans:
        if not any(t["key"] == "attnscope.num_heads" for t in s["tags"]):
            continue
        up = parent[s["spanID"]]
        while up is not None and up not in requests:
            up = parent.get(up)
        inside, outside = (inside + 1, outside) if up else (inside, outside + 1)
    return inside, outside


@pytest.mark.parametrize("with_context", [False, True], ids=["plain-thread", "copied-context"])
def test_generate_on_another_thread(tmp_path: Path, with_context: bool, capsys: Any) -> None:
    trace, report, page = tmp_path / "t.json", tmp_path / "r.json", tmp_path / "r.html"
    _serve(trace, with_context)
    inside, outside = _in_requests(trace)
    assert inside + outside == 2 * 2 * 3  # two requests, two layers, three forwards
    assert run_report(trace, json_path=str(report), html=str(page)) == 0
    html = " ".join(page.read_text().split())
    text = capsys.readouterr().out
    doc = json.loads(report.read_text())["end_to_end"]
    (block,) = doc["blocks"]
    assert block["attention_calls"] == inside
    assert doc["attention_calls_outside_blocks"] == outside
    if with_context:
        assert (inside, outside) == (12, 0)
        assert "in none" not in text and "in none" not in html
    else:
        assert (inside, outside) == (0, 12)
        assert "12 attention calls ran while one of your blocks was open, but in none" in \
            " ".join(text.split())
        assert "contextvars.copy_context().run" in text.replace("\n", "")
        assert "12 attention calls ran while one of your blocks was open, but in none" in html


def _serve_async(path: Path, with_context: bool) -> None:
    """Two requests of an asyncio server that runs the blocking generate() in the loop's
    executor (which, unlike ``asyncio.to_thread``, does not copy the context)."""
    import asyncio

    model = _llama()

    def generate(ids: torch.Tensor) -> Any:
        with torch.no_grad():
            return model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)

    async def request(i: int) -> None:
        loop = asyncio.get_running_loop()
        ids = torch.randint(1, 64, (1, 6))
        with attnscope.span("request", attributes={"n": i}):
            if with_context:
                await loop.run_in_executor(None, contextvars.copy_context().run, generate, ids)
            else:
                await loop.run_in_executor(None, generate, ids)

    async def serve() -> None:
        for i in range(2):
            await request(i)

    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    attnscope.instrument(model)
    try:
        asyncio.run(serve())
    finally:
        attnscope.uninstrument(model)
        assert attnscope.shutdown(timeout_s=30.0)


@pytest.mark.parametrize("with_context", [False, True], ids=["plain", "copied-context"])
def test_generate_in_asyncios_executor(tmp_path: Path, with_context: bool, capsys: Any) -> None:
    trace = tmp_path / "t.json"
    _serve_async(trace, with_context)
    assert _in_requests(trace) == ((12, 0) if with_context else (0, 12))
    assert run_report(trace) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("loop.run_in_executor" in text) is not with_context
