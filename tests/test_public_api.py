"""The public surface is exactly what __all__ says, and the demo runs."""

from __future__ import annotations

import io
import pathlib
import subprocess
import sys

import attnscope


def test_all_is_the_public_surface() -> None:
    core = {
        "Config", "Span", "__version__", "batch", "configure", "flush", "rank", "sampling",
        "shutdown",
        "span", "stats", "step", "trace", "world_size",
    }
    assert core <= set(attnscope.__all__)
    for name in attnscope.__all__:
        assert getattr(attnscope, name) is not None
    public_modules = {n for n in dir(attnscope) if not n.startswith("_")}
    # Public on purpose: testing, exporters, cli. The packages of the layout (_capture, _record,
    # _worker, _export, _instrument) are private by name; everything else is __all__.
    assert public_modules - set(attnscope.__all__) <= {"testing", "exporters", "cli", "annotations"}


def test_stats_span_count_keys_are_pinned() -> None:
    """The span and export counts of ``stats()`` (docs/sampling.md), all there from the start."""
    counts = ("captured", "emitted", "dropped_queue_full", "dropped_trace_cap", "orphaned",
              "pending", "worker_errors", "exported", "export_failed", "export_dropped",
              "export_in_flight")
    stats = attnscope.stats()
    assert {k: stats[k] for k in counts} == dict.fromkeys(counts, 0)


def test_the_stats_example_in_the_docs_has_every_key_stats_has() -> None:
    import ast
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "sampling.md").read_text()
    shown = re.search(r">>> attnscope\.stats\(\)\n(\{.*?\})\n```", text, re.S)
    assert shown is not None
    assert list(ast.literal_eval(shown.group(1))) == list(attnscope.stats())


def test_demo_prints_a_table_for_both_implementations(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from attnscope.cli.demo._run import run_demo

    out = io.StringIO()
    trace_file = tmp_path / "demo.json"
    assert run_demo(steps=2, seq_len=32, jaeger_json=str(trace_file), out=out) == 0
    text = out.getvalue()
    assert "attention.naive" in text and "attention.sdpa" in text and "p99" in text
    assert trace_file.exists() and trace_file.stat().st_size > 100
    import json

    traces = json.loads(trace_file.read_text())["data"]
    layers = {tag["value"] for trace in traces for span in trace["spans"] for tag in span["tags"]
              if tag["key"] == "attnscope.module"}
    assert layers == {f"layers.{i}.attn" for i in range(4)}  # the four layers can be told apart
    for trace in traces:
        (process,) = trace["processes"].values()
        keys = {tag["key"] for tag in process["tags"]}
        assert process["serviceName"] == "attnscope-demo" and {"host.name", "process.pid"} <= keys
    assert "layers.0.attn" in text  # profiled rows name their layer


def test_cli_entry_point(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from attnscope.cli import main

    assert main(["demo", "--steps", "1", "--seq-len", "16", "--jaeger-json", ""]) == 0
    assert "attention.sdpa" in capsys.readouterr().out


def test_no_public_name_is_hidden_by_a_submodule() -> None:
    """attnscope binds its public names on first use (PEP 562); a submodule of the same name,
    imported first, would be bound in its place (``attnscope.instrument`` was the package)."""
    root = pathlib.Path(attnscope.__file__).parent
    submodules = {p.stem if p.suffix else p.name for p in root.iterdir()
                  if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert not submodules & set(attnscope.__all__)
    code = ("import importlib, pkgutil, attnscope\n"
            "for m in pkgutil.walk_packages(attnscope.__path__, 'attnscope.'):\n"
            "    if not any(s in m.name for s in ('.cli', 'testing', '__main__')):\n"
            "        importlib.import_module(m.name)\n"
            "import types\n"
            "bad = [n for n in attnscope.__all__\n"
            "       if isinstance(getattr(attnscope, n), types.ModuleType)]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _annotation(value: object) -> str:
    """An annotation as written (TypedDict keeps a string one as a ForwardRef)."""
    return str(getattr(value, "__forward_arg__", value))


def test_configure_is_typed_with_every_setting_of_config() -> None:
    """``Settings``: a key per Config field, of the field's type or None (None: back to the
    default), every one optional; ``configure()`` takes them as its named parameters (``<not
    given>`` by default) and ``**other: Unpack[OtherSettings]``, the rest of them."""
    import dataclasses
    import inspect

    from attnscope._config import Config, OtherSettings, Settings

    fields = {f.name: str(f.type) for f in dataclasses.fields(Config)}
    assert Settings.__optional_keys__ == set(fields) and not Settings.__required_keys__
    for name, annotation in Settings.__annotations__.items():
        written = fields[name]
        assert _annotation(annotation) == (
            written if written.endswith("| None") else f"{written} | None"), name
    *named, other = inspect.signature(attnscope.configure).parameters.values()
    assert other.kind is inspect.Parameter.VAR_KEYWORD
    assert other.annotation == "Unpack[OtherSettings]"
    assert {p.name for p in named} | OtherSettings.__optional_keys__ == set(fields)
    assert not {p.name for p in named} & OtherSettings.__optional_keys__
    for p in named:
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and repr(p.default) == "<not given>"
        assert p.annotation.replace(" | _NotGiven", "") == _annotation(
            Settings.__annotations__[p.name]), p.name


def test_configure_still_checks_at_run_time() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown setting"):
        attnscope.configure(sample_rat=0.5)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="sample_rate"):
        attnscope.configure(sample_rate="high")  # type: ignore[typeddict-item]
    with pytest.raises(TypeError):
        attnscope.configure(0.5)  # type: ignore[call-arg]


def test_stats_is_typed_with_exactly_its_keys() -> None:
    from attnscope._stats import Stats

    stats = attnscope.stats()
    assert set(Stats.__required_keys__) == set(stats) and not Stats.__optional_keys__
    for key, annotation in Stats.__annotations__.items():
        assert type(stats[key]).__name__ == _annotation(annotation), key  # type: ignore[literal-required]
