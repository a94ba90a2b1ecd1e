"""The one number formatter every command prints with (``attnscope/cli/render/units.py``)."""

from __future__ import annotations

import math

import pytest

from attnscope.cli.render.units import MISSING, bytes_, duration, quantity, si


@pytest.mark.parametrize(("ns", "text"), [
    (850, "850 ns"), (999, "999 ns"), (1_000, "1 µs"), (12_345, "12.3 µs"),
    (4_561_000, "4.56 ms"), (1_234_000_000, "1.23 s"), (1_234_000_000_000, "1234 s"),
    (None, MISSING), (math.nan, MISSING), (math.inf, MISSING)])
def test_duration(ns: float | None, text: str) -> None:
    assert duration(ns) == text


@pytest.mark.parametrize(("value", "unit", "text"), [
    (12, "", "12"), (5_610, "", "5.61 k"), (1.66e6, "", "1.66 M"), (2.5e12, "", "2.5 T"),
    (999, "tok/s", "999 tok/s"), (279_000, "tok/s", "279 k tok/s"),
    (8.32e6, "tok/s", "8.32 M tok/s"), (None, "", MISSING), (math.nan, "tok/s", MISSING)])
def test_si(value: float | None, unit: str, text: str) -> None:
    assert si(value, unit) == text


@pytest.mark.parametrize(("n", "text"), [
    (512, "512 B"), (1_023, "1023 B"), (1_024, "1 KiB"), (427_000, "417 KiB"),
    (3 * 2**20 + 2**16, "3.06 MiB"), (1.5 * 2**30, "1.5 GiB"), (None, MISSING)])
def test_bytes(n: float | None, text: str) -> None:
    assert bytes_(n) == text


def test_quantity_is_the_unit_of_a_metric_kind() -> None:
    assert quantity(917_000, "time") == duration(917_000) == "917 µs"
    assert quantity(204 * 1024, "memory") == bytes_(204 * 1024) == "204 KiB"
    assert quantity(279_000, "tokens_per_s") == "279 k tok/s"
    assert quantity(math.nan, "time") == MISSING == "—"


def test_a_value_that_rounds_up_to_the_next_unit_is_written_in_it() -> None:
    # 999.7 µs shown to 3 digits is 1000 µs: it reads "1 ms", never "1e+03 µs"
    assert duration(999_700) == "1 ms" and duration(999.7e6) == "1 s"
    assert duration(999.6) == "1 µs" and duration(999.4) == "999 ns"
    assert duration(999_400) == "999 µs"
    assert si(999.6) == "1 k" and si(999_600) == "1 M" and si(999.4) == "999"
    assert bytes_(1023.6 * 1024) == "1024 KiB"
    assert all("e+" not in duration(v) and "e+" not in si(v)
               for v in (999.5, 999.5e3, 999.5e6, 999.5e9, 999.99, 9.9999e5))
