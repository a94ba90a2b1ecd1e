"""``attnscope diff``'s words and numbers: signed percentages, intervals, the table's
cells and the notes under it, shared by the terminal table and the HTML page."""

from __future__ import annotations

import math

from ..render.units import MISSING, quantity
from . import UNJUDGED_EXIT
from ._groups import Backends, Diary, GroupDiff, Noise
from ._stats import FEW, Change, calls_needed

__all__ = ["HEADERS", "NOISE_HEADERS", "UNJUDGED_EXIT", "group_label", "names", "signed_percent",
           "interval", "verdict_text", "row_cells", "noise_cells", "noise_note", "notes",
           "method_note", "gate_unjudged_note", "gate_inconclusive_note", "side_backend_text",
           "backend_text", "layer_cell"]

_RUNS_SHOWN = 6    # per-run p50s listed in the noise table (more: the smallest and largest)
_INCONCLUSIVE_SHOWN = 3  # straddling groups named on the gate's line (a line, not a list)


def names(keys: list[tuple[tuple[str, str | None], int]]) -> str:
    shown = ", ".join(group_label(k) for k, _ in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def group_label(key: tuple[str, str | None]) -> str:
    return f"{key[0]} ({key[1]})" if key[1] else key[0]


def side_backend_text(b: Backends) -> str:
    """One side's backends: ``sdpa``, ``eager/sdpa`` (most calls first), ``—`` for calls with
    none known (timed, never profiled), ``sdpa/—`` when only some are known."""
    return "/".join([*b.names, *([MISSING] if b.unknown else [])]) or MISSING


def backend_text(group: GroupDiff) -> str:
    """``eager → sdpa``, or one name when both sides ran the same."""
    before = side_backend_text(group.backends_before)
    after = side_backend_text(group.backends_after)
    return before if before == after else f"{before} → {after}"


# -- numbers as text ------------------------------------------------------------------------


def signed_percent(fraction: float) -> str:
    if math.isnan(fraction):
        return MISSING
    if math.isinf(fraction):
        return "+inf" if fraction > 0 else "-inf"
    return f"{fraction * 100:+.1f}%"


def interval(change: Change) -> str:
    if math.isnan(change.low) or math.isnan(change.high):
        return MISSING
    return f"[{signed_percent(change.low)}, {signed_percent(change.high)}]"


def verdict_text(change: Change) -> str:
    if change.verdict == FEW:
        if not change.n_before or not change.n_after:
            return "not measured"
        # over runs, every run needs that many: a side's total may well be larger
        per_run = " in a run" if max(len(change.runs_before), len(change.runs_after)) > 1 else ""
        return f"too few calls (< {calls_needed(change.metric.q)}{per_run})"
    return change.verdict


def layer_cell(group: GroupDiff, row: int) -> str:
    """The first column of a group's ``row``-th line: its name, then its backends under it."""
    if row == 0:
        return group_label((group.module, group.phase))
    return f"backend {backend_text(group)}" if row == 1 else ""


def row_cells(group: GroupDiff, change: Change) -> list[str]:
    """One table row: metric, calls, BEFORE, AFTER, change, interval, verdict."""
    kind = change.metric.value
    return [change.metric.name, f"{change.n_before} / {change.n_after}",
            quantity(change.before, kind), quantity(change.after, kind),
            signed_percent(change.change), interval(change), verdict_text(change)]


HEADERS = ["layer (phase)", "metric", "calls B / A", "BEFORE", "AFTER", "change", "95% CI",
           "verdict"]


NOISE_HEADERS = ["layer (phase)", "runs", "calls", "p50 per run", "noise floor"]


def noise_cells(n: Noise) -> list[str]:
    """One row of a noise-floor table: layer, runs, calls, each run's p50, the spread."""
    shown = list(n.p50s) if len(n.p50s) <= _RUNS_SHOWN else [min(n.p50s), max(n.p50s)]
    joined = (", " if len(n.p50s) <= _RUNS_SHOWN else " … ").join(
        quantity(v, "time") for v in shown)
    spread = MISSING if math.isnan(n.spread) else f"{n.spread * 100:.1f}%"
    return [group_label((n.module, n.phase)), str(len(n.p50s)), str(n.calls), joined or MISSING,
            spread]


def noise_note(floors: list[Noise]) -> str:
    """The line under the noise-floor tables: what the floor is and the largest seen."""
    spreads = [n.spread for n in floors if not math.isnan(n.spread)]
    line = ("noise floor = largest per-run p50 / smallest - 1: the largest p50 change two runs "
            "of the same program showed here")
    if not spreads:
        return line + " (needs 2+ runs with timed calls)"
    return (line + f"; largest {max(spreads) * 100:.1f}%: set --fail-if-slower above the floor "
            "of runs like these")


def method_note(result: Diary) -> str:
    """The first note: how the change and its interval were computed."""
    rule = (f"a verdict (slower, faster, larger, smaller) needs the whole interval beyond "
            f"±{result.min_change:.0%}, however wide; inconclusive: it excludes 0 but straddles "
            f"±{result.min_change:.0%}. "
            "Time: timed calls (profiled calls and calls inside them left out); memory peak: "
            "the calls that measured it.")
    if result.run_level:
        return (f"change = AFTER / BEFORE - 1 of each side's median over runs of the per-run "
                f"quantile ({result.runs_before} BEFORE runs, {result.runs_after} AFTER runs); "
                f"{result.confidence:.0%} hierarchical bootstrap interval (runs, then calls "
                f"within each run): run-to-run noise is in it; {rule}")
    sides = ("one run per side" if max(result.runs_before, result.runs_after) == 1 else
             f"{result.runs_before} BEFORE run(s), {result.runs_after} AFTER run(s)")
    return (f"change = AFTER / BEFORE - 1; {sides}: run-to-run noise is unmeasured (the "
            f"{result.confidence:.0%} interval resamples the calls inside each run, not runs); "
            f"{rule}")


def gate_unjudged_note(limit: float, too_few: bool = False) -> str:
    """Why the gate gave no verdict: one run per side, or (``too_few``) no layer with enough
    timed calls for a p50 verdict, which would otherwise read as a pass."""
    if too_few:
        return (f"gate not judged (exit {UNJUDGED_EXIT}): --fail-if-slower {limit:g} found no "
                f"layer with enough timed calls in every run for a p50 verdict "
                f"({calls_needed(0.5)} per run); record more calls per run (a longer program, "
                "or a higher --sample-rate)")
    return (f"gate not judged (exit {UNJUDGED_EXIT}): --fail-if-slower {limit:g} needs 2+ runs "
            "on each side; for a verdict record them with `attnscope run --repeat 3 --out DIR "
            "-- CMD` on each side and diff the two directories (or pass --call-level-gate to "
            "judge on call-level evidence alone)")


def gate_inconclusive_note(limit: float, unsure: list[tuple[GroupDiff, Change]]) -> str:
    """The groups whose p50 interval straddles the gate: not failed on, but named (a few)."""
    shown = ", ".join(f"{group_label((g.module, g.phase))} {signed_percent(c.change)} "
                      f"{interval(c)}" for g, c in unsure[:_INCONCLUSIVE_SHOWN])
    more = len(unsure) - _INCONCLUSIVE_SHOWN
    return (f"gate inconclusive for {len(unsure)} p50 interval(s) that straddle {limit:g}% "
            f"(not shown slower by more than {limit:g}%, nor shown within it: the gate does not "
            f"fail on them): {shown}{f' and {more} more' if more > 0 else ''}; more runs a side "
            "narrow them")


def notes(result: Diary, limit: float | None,
          failures: list[tuple[GroupDiff, Change]], judged: bool = True) -> list[str]:
    """The lines under the table: method, clocks, one-sided groups, the gate's outcome."""
    lines = [method_note(result)]
    for g in result.groups:
        if g.clock_before != g.clock_after:
            lines.append(f"warning: {group_label((g.module, g.phase))}: BEFORE timed by "
                         f"{g.clock_before} clock, AFTER by {g.clock_after}: not comparable")
    for label, only in (("BEFORE", result.only_before), ("AFTER", result.only_after)):
        for key, n in only:
            lines.append(f"only in {label}: {group_label(key)}, {n} calls")
    if limit is not None and not judged:
        lines.append(gate_unjudged_note(limit, not result.p50_judgeable()))
    elif limit is not None:
        if failures:
            lines += [f"FAIL: {group_label((g.module, g.phase))} p50 {signed_percent(c.change)} "
                      f"(interval {interval(c)}) is slower by more than {limit:g}% beyond noise"
                      for g, c in failures]
        else:
            lines.append(f"gate passed: no p50 slower by more than {limit:g}% beyond noise")
        unsure = result.gate_inconclusive(limit / 100)
        if unsure:
            lines.append(gate_inconclusive_note(limit, unsure))
        unjudged = [g for g in result.groups for c in g.changes
                    if c.metric.name == "p50" and c.verdict == FEW]
        if unjudged:
            lines.append(f"not judged by the gate (too few timed calls for a p50 verdict): "
                         f"{names([((g.module, g.phase), 0) for g in unjudged])}")
    return lines
