"""`attnscope report`'s fallback lines: a count per reason, in the terminal and on the HTML page."""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnscope
from attnscope.cli.report import render_terminal, run_report
from attnscope.cli.report._fallbacks import MAX_REASONS, fallback_lines
from attnscope.cli.report._html import render_html
from attnscope.cli.summary import summarize
from attnscope.cli.traces import SpanRow, attention_calls

DROPOUT = "flash (CPU) does not support dropout (dropout_p=0.3)"
EXCLUDED = "flash was eligible but excluded by an sdpa_kernel context"


def _trace(path: Path) -> None:
    """One row (the SDPA span, no phase, math) whose 5 fallbacks have two reasons: 3 dropout,
    2 forced math; and 2 flash calls."""
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        profile_rate=1.0, profile_max_per_minute=1000.0, overhead_budget=1.0)
    attnscope.instrument_sdpa()
    try:
        q = torch.randn(1, 2, 16, 16)
        with attnscope.sampling(profile=True):
            for _ in range(3):
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)
            for _ in range(2):
                with sdpa_kernel(SDPBackend.MATH):
                    F.scaled_dot_product_attention(q, q, q)
                F.scaled_dot_product_attention(q, q, q)
    finally:
        attnscope.uninstrument_sdpa()
        assert attnscope.shutdown(timeout_s=30.0)


def _reasons(path: Path) -> Counter[str]:
    """The spans' own reasons, counted straight from the file."""
    found: Counter[str] = Counter()
    for trace in json.loads(path.read_text())["data"]:
        for span in trace["spans"]:
            tags = {t["key"]: t["value"] for t in span["tags"]}
            if tags.get("attnscope.backend.fallback") is True:
                found[tags["attnscope.backend.reason"]] += 1
    return found


def test_each_reason_gets_its_own_count_in_the_terminal_and_the_page(
        tmp_path: Path, capsys: Any) -> None:
    trace, page = tmp_path / "t.json", tmp_path / "r.html"
    _trace(trace)
    assert _reasons(trace) == {DROPOUT: 3, EXCLUDED: 2}
    assert run_report(trace, html=str(page)) == 0
    text = capsys.readouterr().out
    want = ["Fallback: scaled_dot_product_attention · math (—): 5 call(s) ran the math kernel, "
            "for 2 reasons:", f"  3 call(s) — {DROPOUT}", f"  2 call(s) — {EXCLUDED}"]
    lines = [line.rstrip() for line in text.splitlines()]
    start = lines.index(want[0])
    assert lines[start:start + 3] == want
    assert sum("ran the math kernel" in line for line in lines) == 1
    section = page.read_text().split("<h2>Silent fallbacks</h2>", 1)[1].split("</section>")[0]
    body = html.unescape(section.split("<pre", 1)[1].split(">", 1)[1].split("</pre>")[0])
    assert body.splitlines() == want


def _call(n: int, reason: str, expected: str = "none", module: str = "layers.0.attn",
          fell: bool = True) -> SpanRow:
    a: dict[str, Any] = {"attnscope.tier": "profile", "attnscope.module": module,
                         "attnscope.phase": "prefill", "attnscope.wall_ns": 1000,
                         "attnscope.num_heads": 4, "attnscope.sample_rate": 1.0,
                         "attnscope.backend": "math", "attnscope.backend.fallback": fell,
                         "attnscope.backend.expected": expected,
                         "attnscope.backend.reason": reason}
    return SpanRow("a" * 32, f"{n:016x}", None, "Attention.forward", 1000 * n, 1000 * n + 1000,
                   a, "svc")


def _rows() -> list[SpanRow]:
    """9 fallbacks of one row, 5 reasons (4, 2, 1, 1, 1 calls); one reason with markup in it;
    and a row with a single one, flash eligible."""
    reasons = [EXCLUDED] * 4 + [DROPOUT] * 2 + ["attn_mask <float32> & more", "r4", "r5"]
    rows = [_call(n, r, "flash" if r == EXCLUDED else "none") for n, r in enumerate(reasons)]
    rows.append(_call(20, "flash was eligible but the math kernel ran", "flash", "layers.1.attn"))
    return rows


def test_the_reasons_are_bounded_with_the_rest_counted_and_the_page_escapes_them() -> None:
    rows = _rows()
    calls = attention_calls(rows)
    summary = summarize(calls, top=5, rows=rows)
    lines = fallback_lines(summary, calls)
    assert MAX_REASONS == 3
    assert lines == [
        "Fallback: layers.0.attn (prefill): 9 call(s) ran the math kernel, for 5 reasons:",
        f"  4 call(s) — {EXCLUDED}",
        f"  2 call(s) — {DROPOUT}",
        "  1 call(s) — attn_mask <float32> & more",
        "  2 call(s) for 2 more reason(s)",
        "Fallback: layers.1.attn (prefill): 1 call(s) ran the math kernel — flash was eligible "
        "but the math kernel ran"]
    # the counts printed add up to the row's fallbacks
    assert 4 + 2 + 1 + 2 == summary.groups[0].fallbacks.calls  # type: ignore[union-attr]
    text = render_html(summary, rows, source="t", top=5)
    assert "attn_mask &lt;float32&gt; &amp; more" in text and "<float32>" not in text
    section = text.split("<h2>Silent fallbacks</h2>", 1)[1].split("</section>")[0]
    body = html.unescape(section.split("<pre", 1)[1].split(">", 1)[1].split("</pre>")[0])
    assert body.splitlines() == lines


def test_without_the_calls_the_terminal_says_most_frequent_not_all(capsys: Any) -> None:
    """render_terminal given the summary only (the demo): the row's total and its most frequent
    reason, said as that; given the calls, the counts per reason."""
    rows = _rows()
    calls = attention_calls(rows)
    summary = summarize(calls, top=5, rows=rows)
    render_terminal(summary, source="t", spans=len(rows), top=5, out=None)
    text = capsys.readouterr().out
    assert (f"9 call(s) ran the math kernel (the most frequent reason: {EXCLUDED})"
            in " ".join(text.split()))
    render_terminal(summary, source="t", spans=len(rows), top=5, out=None, calls=calls)
    text = capsys.readouterr().out
    assert "  4 call(s) — " + EXCLUDED in text and "for 2 more reason(s)" in text


def test_a_page_without_fallbacks_has_no_fallback_section() -> None:
    rows = [_call(1, DROPOUT, fell=False)]
    calls = attention_calls(rows)
    text = render_html(summarize(calls, top=5, rows=rows), rows, source="t", top=5)
    assert "Silent fallbacks" not in text


def test_the_fallback_section_renders_in_a_browser(tmp_path: Path) -> None:
    from tests.support.browser import dom_of

    rows = _rows()
    calls = attention_calls(rows)
    summary = summarize(calls, top=5, rows=rows)
    page = tmp_path / "fallbacks.html"
    page.write_text(render_html(summary, rows, source="t", top=5))
    dom = dom_of(page)
    assert "<h2>Silent fallbacks</h2>" in dom
    assert "attn_mask &lt;float32&gt; &amp; more" in dom
