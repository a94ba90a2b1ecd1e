"""docs/attributes.md (and the metrics of docs/exporting.md) and attnscope/_schema.py agree."""

from __future__ import annotations

import ast
import pathlib
import re

import attnscope
from attnscope import _schema as schema

ROOT = pathlib.Path(attnscope.__file__).parent
DOC = ROOT.parent / "docs" / "attributes.md"
_ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+) \| ([^|]+) \|", re.M)
_NAMED = re.compile(r"`((?:attnscope|gen_ai)\.[a-z_.]*[a-z_])`")


def _rows() -> dict[str, tuple[str, str]]:
    """Every attribute row of the page's tables: name -> (type, unit); a unit "—" is none."""
    rows: dict[str, tuple[str, str]] = {}
    for name, type_, unit in _ROW.findall(DOC.read_text()):
        assert name not in rows, f"{name} is listed twice"
        rows[name] = (type_.strip(), "" if unit.strip() == "—" else unit.strip())
    return rows


def test_every_schema_attribute_is_documented_with_its_type_and_unit() -> None:
    rows = _rows()
    for attr in schema.ATTRIBUTES:
        assert attr.name in rows, f"{attr.name} is not in docs/attributes.md"
        assert rows[attr.name] == (attr.type, attr.unit), attr.name


def test_every_documented_attribute_is_in_the_schema() -> None:
    names = {a.name for a in schema.ATTRIBUTES}
    assert set(_rows()) <= names
    # named in the prose too: `attnscope.instrument(model)` and `attnscope.kernel.*` are not names
    # and the GenAI conventions' metric names and the ones the page says attnscope leaves out
    # (and the request spans' name)
    named = names | {m.name for m in schema.METRICS} | {"gen_ai.provider.name", "gen_ai.system",
                                                         "attnscope.request"}
    assert set(_NAMED.findall(DOC.read_text())) <= named


def test_names_are_unique_and_prefixed_once() -> None:
    names = [a.name for a in schema.ATTRIBUTES]
    assert len(names) == len(set(names))
    # OpenTelemetry's own semantic-convention names, used as they are
    otel = ("code.function.name", "host.name", "host.arch", "host.cpu.model.name",
            "process.command_args", "process.creation.time")
    assert all(n.startswith((schema.PREFIX, "gen_ai.")) or n in otel for n in names)
    metrics = [m.name for m in schema.METRICS]
    # the GenAI conventions' server metrics keep OpenTelemetry's names
    assert len(metrics) == len(set(metrics)) and all(
        m.startswith((schema.PREFIX, "gen_ai.server.")) for m in metrics)


def test_worker_export_and_metrics_spell_no_attribute_name() -> None:
    """The worker side (its thread, the derivation, the span builder, profiles), the exporters
    and the metrics take every name from the schema: none of its names (with the prefix or
    without) is a string literal there."""
    full = {a.name for a in schema.ATTRIBUTES} | {m.name for m in schema.METRICS}
    otel = {"code.function.name", "host.name"}  # OpenTelemetry's names, also resource keys
    full -= otel
    keys = {a.key for a in schema.ATTRIBUTES if "." in a.key or "_" in a.key} - full - otel
    packages = ("_worker", "_derive", "_spans", "_profiles", "_export")
    for path in [p for package in packages for p in ROOT.joinpath(package).rglob("*.py")]:
        # _derive/result.py maps its dataclass's field names (some spelled like keys) to the schema
        names = full if path.name == "result.py" else full | keys
        tree = ast.parse(path.read_text())
        exported = {id(c) for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "__all__" for t in node.targets)
                    for c in ast.walk(node.value)}  # function names, not attributes
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in exported:
                assert node.value not in names, f"{path.name}: {node.value!r}"


def test_the_metric_instruments_are_those_docs_exporting_states() -> None:
    text = (DOC.parent / "exporting.md").read_text()
    row = r"^\| `((?:attnscope|gen_ai)\.[a-z_.]+)` \| [a-z ]+, `([^`]+)`"
    documented = dict(re.findall(row, text, re.M))
    assert documented == {m.name: m.unit for m in schema.METRICS}
