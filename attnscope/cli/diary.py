"""The performance diary: the file ``attnscope diff --append-diary PATH.jsonl`` writes, read back
as a table (terminal, JSON, a self-contained HTML page with p50/p99 over the entries).

The format is JSON Lines: one comparison a line, each a JSON object with ``"schema": 1``, never
rewritten (an append-only log a person can ``tail``, ``grep`` and keep in git). Its keys are in
docs/cli.md; the ones read here:

- ``date`` (UTC, ISO 8601), ``note`` (what the user changed, or null);
- ``before`` / ``after``: ``paths``, ``runs``, ``run_info`` (:func:`..runinfo.run_info` of the
  side's first run: ``command``, ``started``, ``hosts`` ...), ``noise`` (per group, several runs);
- ``groups``: per (module, phase) its backends each side, ``time_ns`` {p50, p95, p99: before,
  after, change, interval, verdict} and ``verdict`` (the p50's: the gate's metric);
- ``gate``: ``fail_if_slower`` (a fraction, or null), ``outcome`` (passed / failed / not judged /
  no gate).

A line that is not such an object (cut short by a full disk, edited by hand, from a newer
attnscope) is skipped, and :func:`load` says how many on one stderr line: one bad line never
hides the rest of the diary.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from ._errors import CLIError
from .render.units import MISSING

__all__ = ["SCHEMA", "NOTE_LIMIT", "load", "summary", "to_json", "render_terminal", "render_html",
           "run_diary_report"]

SCHEMA = 1
NOTE_LIMIT = 500  # characters of --diary-note
COMMAND_SHOWN = 60  # characters of a command in the table
# the order the verdict counts are listed in
_VERDICTS = ("slower", "inconclusive", "no change", "faster", "too few calls", "not measured")
HEADERS = ["#", "date", "note", "command (BEFORE → AFTER)", "runs B / A", "p50 verdicts",
           "largest p50 change", "gate"]


def _valid(doc: Any) -> bool:
    return (isinstance(doc, dict) and doc.get("schema") == SCHEMA
            and isinstance(doc.get("date"), str) and isinstance(doc.get("groups"), list)
            and all(isinstance(g, dict) for g in doc["groups"])
            and all(isinstance(doc.get(side), dict) for side in ("before", "after")))


def load(path: str, err: TextIO | None = None) -> list[dict[str, Any]]:
    """The entries of the diary ``path``, in file order. Malformed lines are skipped and counted
    on one line of ``err`` (stderr); blank lines are not entries. A file that cannot be read:
    :class:`CLIError`."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise CLIError(f"diary {path}: cannot read it ({exc.strerror or exc})") from None
    entries, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            doc = None
        if _valid(doc):
            entries.append(doc)
        else:
            bad.append(number)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5
                                                else "")
        print(f"attnscope diary {path}: skipped {len(bad)} malformed line"
              f"{'s' if len(bad) > 1 else ''} (line{'s' if len(bad) > 1 else ''} {shown}; "
              f"not a schema-{SCHEMA} diary entry)", file=err or sys.stderr)
    return entries


# -- one row per entry ----------------------------------------------------------------------


def _label(group: Mapping[str, Any]) -> str:
    return f"{group.get('module')} ({group['phase']})" if group.get("phase") else \
        str(group.get("module"))


def _finite(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _time(group: Mapping[str, Any], q: str) -> Mapping[str, Any]:
    times = group.get("time_ns")
    value = times.get(q) if isinstance(times, dict) else None
    return value if isinstance(value, dict) else {}


def _command(side: Mapping[str, Any]) -> str:
    """The side's command (``run_info``), else its paths: what a person recognises a run by."""
    info = side.get("run_info")
    command = info.get("command") if isinstance(info, dict) else None
    if isinstance(command, str) and command.strip():
        return command
    paths = side.get("paths")
    return " ".join(map(str, paths)) if isinstance(paths, list) and paths else MISSING


def _short(text: str) -> str:
    """One line of at most ``COMMAND_SHOWN`` characters (a ``python -c`` program is a page);
    the whole command stays in the entry and in :func:`to_json`."""
    line = " ".join(text.split())
    return line if len(line) <= COMMAND_SHOWN else line[:COMMAND_SHOWN - 1] + "…"


def _verdict_word(verdict: str) -> str:
    """A p50 verdict as counted: "too few calls (< 20 in a run)" counts as "too few calls"."""
    return "too few calls" if verdict.startswith("too few calls") else verdict


def summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What the diary table shows of one entry, as plain values: date, note, each side's
    command and runs, how many groups got each p50 verdict, the largest p50 change (by
    size, either way), its group and that group's p50 verdict, the gate's outcome."""
    groups = entry["groups"]
    verdicts = Counter(_verdict_word(str(g["verdict"])) for g in groups
                       if g.get("verdict") is not None)
    largest: tuple[float, str, str | None] | None = None
    for g in groups:
        change = _finite(_time(g, "p50").get("change"))
        if change is not None and (largest is None or abs(change) > abs(largest[0])):
            verdict = g.get("verdict")
            largest = (change, _label(g), _verdict_word(str(verdict)) if verdict else None)
    given = entry.get("gate")
    gate: Mapping[str, Any] = given if isinstance(given, dict) else {}
    limit = _finite(gate.get("fail_if_slower"))
    return {
        "date": entry["date"], "note": entry.get("note"),
        "before_command": _command(entry["before"]), "after_command": _command(entry["after"]),
        "runs_before": entry["before"].get("runs"), "runs_after": entry["after"].get("runs"),
        "verdicts": dict(sorted(verdicts.items(), key=lambda kv: _verdict_order(kv[0]))),
        "largest_p50_change": None if largest is None else
        {"group": largest[1], "change": largest[0], "verdict": largest[2]},
        "gate": {"fail_if_slower": limit, "outcome": gate.get("outcome", "no gate")},
    }


def _verdict_order(word: str) -> tuple[int, str]:
    return (_VERDICTS.index(word) if word in _VERDICTS else len(_VERDICTS), word)


def _cells(index: int, row: Mapping[str, Any]) -> list[str]:
    before, after = row["before_command"], row["after_command"]
    command = _short(before) if before == after else f"{_short(before)} → {_short(after)}"
    counts = ", ".join(f"{n} {word}" for word, n in row["verdicts"].items()) or MISSING
    largest = row["largest_p50_change"]
    moved = MISSING if largest is None else \
        f"{largest['change'] * 100:+.1f}% {largest['group']}" + \
        ("" if largest.get("verdict") in (None, "slower", "faster")
         else f": {largest['verdict']}")  # a change no verdict stands behind says so
    gate = row["gate"]
    limit = gate["fail_if_slower"]
    outcome = str(gate["outcome"]) + (f" ({limit * 100:g}%)" if limit is not None else "")
    date = row["date"].replace("T", " ")
    runs = f"{row['runs_before'] if row['runs_before'] is not None else MISSING} / " \
           f"{row['runs_after'] if row['runs_after'] is not None else MISSING}"
    return [str(index), date, row["note"] or MISSING, command, runs, counts, moved, outcome]


def to_json(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The diary as one document: each entry's table row (:func:`summary`) and the entry."""
    return {"schema": SCHEMA, "entries": len(entries),
            "rows": [summary(e) for e in entries], "diary": list(entries)}


# -- the terminal ---------------------------------------------------------------------------


def render_terminal(entries: Sequence[Mapping[str, Any]], out: TextIO | None = None) -> None:
    """The diary as a table on ``out`` (stdout): one row per entry, oldest first."""
    from rich.table import Table
    from rich.text import Text

    from .render.console import console as make_console

    console = make_console(out)
    table = Table(title=f"attnscope performance diary: {len(entries)} "
                        f"entr{'y' if len(entries) == 1 else 'ies'}", title_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="right" if i in (0, 4) else "left",
                         no_wrap=i in (0, 1, 4), overflow="fold")
    for i, entry in enumerate(entries, 1):
        cells: list[Any] = _cells(i, summary(entry))
        outcome = summary(entry)["gate"]["outcome"]
        cells[7] = Text(cells[7], style="red" if outcome == "failed" else
                        "green" if outcome == "passed" else "")
        table.add_row(*cells)
    console.print(table)
    console.print("p50 verdicts: how many layer/phase groups the entry's p50 time called each "
                  "way; largest p50 change: the group whose p50 moved most (AFTER / BEFORE - 1)",
                  soft_wrap=True)


# -- the HTML page --------------------------------------------------------------------------


def _series(entries: Sequence[Mapping[str, Any]], q: str
            ) -> dict[str, list[tuple[int, float | None, float | None]]]:
    """Per group, (entry index, BEFORE, AFTER) of the time quantile ``q`` in ns."""
    out: dict[str, list[tuple[int, float | None, float | None]]] = {}
    for i, entry in enumerate(entries, 1):
        for g in entry["groups"]:
            t = _time(g, q)
            out.setdefault(_label(g), []).append((i, _finite(t.get("before")),
                                                  _finite(t.get("after"))))
    return out


def _plot(entries: Sequence[Mapping[str, Any]], q: str) -> str:
    from .render import html as _html

    series = _series(entries, q)
    if not any(v is not None for points in series.values() for _, b, a in points
               for v in (b, a)):
        return ""
    fig = _html.figure(11, 3.8)
    ax = fig.subplots()
    for k, (label, points) in enumerate(series.items()):
        colour = _html.PALETTE[k % len(_html.PALETTE)]
        after = [(i, a / 1e6) for i, _, a in points if a is not None]
        before = [(i, b / 1e6) for i, b, _ in points if b is not None]
        if after:
            ax.plot(*zip(*after, strict=True), "o-", color=colour, label=label, markersize=5)
        if before:
            ax.plot(*zip(*before, strict=True), "o", color=colour, markerfacecolor="none",
                    markersize=5, alpha=0.7)
    if len(entries) <= 20:
        ax.set_xticks(range(1, len(entries) + 1),
                      [f"#{i}\n{e['date'][:10]}" for i, e in enumerate(entries, 1)], fontsize=8)
    else:  # a long diary: entry numbers only, as many as fit
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"{q} time (ms)")
    ax.set_xlabel("diary entry: AFTER (filled, joined) and BEFORE (hollow) of each comparison")
    ax.grid(axis="y", color="#e6e8ec")
    ax.set_axisbelow(True)
    if len(series) <= 16:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return _html.svg(fig)


# note, command, verdicts, largest change: free text, wrapped to keep the page's width
_WRAPPED = (2, 3, 5, 6)


def _html_table(rows: Sequence[Sequence[str]]) -> str:
    """:func:`.render.html.table`'s table, but the free-text columns wrap (the shared style keeps
    every cell on one line, which a 500-character note would push off the page)."""
    from .render.html import escape

    def cell(tag: str, i: int, value: str) -> str:
        attrs = "" if i in (0, 4) else ' class="l"'
        if i in _WRAPPED:
            attrs += ' style="white-space:normal;min-width:12em"'
        return f"<{tag}{attrs}>{escape(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(HEADERS))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(entries: Sequence[Mapping[str, Any]]) -> str:
    """The diary as one self-contained page: the table, then p50 and p99 per group over the
    entries (matplotlib, inline SVG; :mod:`.render.html`)."""
    from .render import html as _html

    rows = [_cells(i, summary(e)) for i, e in enumerate(entries, 1)]
    sections = [("Entries", _html_table(rows)),
                ("p50 time per layer over the entries", _plot(entries, "p50")),
                ("p99 time per layer over the entries", _plot(entries, "p99"))]
    first = entries[0]["date"] if entries else MISSING
    last = entries[-1]["date"] if entries else MISSING
    return _html.page("attnscope performance diary", [(h, b) for h, b in sections if b],
                      subtitle=f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, "
                      f"{first} … {last}")


def run_diary_report(path: str, *, html: str | None = None, json_path: str | None = None,
                     out: TextIO | None = None) -> int:
    """``attnscope report --diary PATH``: the table on ``out`` (stdout), and the page / the
    document when asked (``json_path`` ``-``: the document on ``out`` instead of the table).
    Returns the exit code: 0; bad input raises :class:`CLIError` (exit 2)."""
    from .render.writer import check_output, write_text

    check_output(html, "--html")  # before the work
    check_output(json_path, "--json")
    stream = out if out is not None else sys.stdout
    entries = load(path)
    if not entries and json_path != "-":
        print(f"diary {path}: no entries yet (append one with `attnscope diff BEFORE AFTER "
              f"--append-diary {path}`)", file=stream)
    if html:
        write_text(html, render_html(entries), "--html")
    if json_path:
        text = json.dumps(to_json(entries), indent=2) + "\n"
        if json_path == "-":
            stream.write(text)
        else:
            write_text(json_path, text, "--json")
    if json_path != "-" and entries:
        render_terminal(entries, stream)
    return 0
