"""What a trace was a run of: command, start, host, device, versions and settings.

Two sources, read together: ``run.json``, which ``attnscope run`` writes into its directory (the
command as typed, start, end and exit code), and the resource attributes every attnscope process
puts on its spans (a trace written by ``configure()`` alone has only these). Where the processes
of one trace differ (ranks on several hosts), every distinct value is kept, in order.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import _schema as schema
from .run._output import RUN_INFO
from .traces import SpanRow

__all__ = ["RUN_INFO", "run_info", "describe"]

_SETTINGS = (("sample_rate", schema.CONFIG_SAMPLE_RATE.name),
             ("profile_rate", schema.CONFIG_PROFILE_RATE.name),
             ("overhead_budget", schema.CONFIG_OVERHEAD_BUDGET.name),
             ("warmup_calls", schema.CONFIG_WARMUP_CALLS.name))


def _distinct(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v is not None and v != "" and v not in out:
            out.append(v)
    return out


def _read_run_file(path: Path) -> dict[str, Any]:
    """``run.json`` of a run directory (or of the directory a trace file is in); {} if none."""
    directory = path if path.is_dir() else path.parent
    try:
        doc = json.loads((directory / RUN_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _command_text(value: Any) -> str | None:
    if isinstance(value, list) and all(isinstance(a, str) for a in value) and value:
        return shlex.join(value)
    return None


def run_info(path: str | os.PathLike[str], rows: Sequence[SpanRow]) -> dict[str, Any]:
    """The run's metadata as plain JSON values (keys in docs/cli.md); None where unknown."""
    resources: list[Mapping[str, Any]] = []
    seen_ids: set[int] = set()
    seen: set[str] = set()
    for row in rows:
        if not row.resource or id(row.resource) in seen_ids:
            continue
        seen_ids.add(id(row.resource))
        # Jaeger repeats a process's tags in every trace: one process, however many copies
        key = json.dumps(dict(row.resource), sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            resources.append(row.resource)

    def each(key: str) -> list[Any]:
        return _distinct([r.get(key) for r in resources])

    run = _read_run_file(Path(path))
    commands = _distinct([_command_text(r.get(schema.COMMAND_ARGS.name)) for r in resources])
    command = _command_text(run.get("command")) or (commands[0] if commands else None)
    started = run.get("started") if isinstance(run.get("started"), str) else None
    starts = sorted(each(schema.PROCESS_START.name))
    devices = each(schema.DEVICE_NAME.name) or each(schema.CPU_NAME.name)
    settings: dict[str, Any] = {}
    given: dict[str, Any] = run["settings"] if isinstance(run.get("settings"), dict) else {}
    for name, key in _SETTINGS:
        values = each(key)
        settings[name] = values[0] if len(values) == 1 else (values or None)
        value = given.get(name)  # a number (a string in an older run.json)
        if settings[name] is None and isinstance(value, (int, float)) and not isinstance(
                value, bool):
            settings[name] = value
        elif settings[name] is None and isinstance(value, str):
            settings[name] = _number(value)
    return {
        "command": command,
        "started": started or (starts[0] if starts else None),
        "duration_s": run.get("duration_s") if isinstance(run.get("duration_s"), (int, float))
        else None,
        "exit_code": run.get("exit_code") if isinstance(run.get("exit_code"), int) else None,
        "processes": _processes(resources),
        "hosts": each("host.name") or _distinct([run.get("host")]),
        "arch": each(schema.HOST_ARCH.name) or _distinct([run.get("arch")]),
        "devices": devices,
        "versions": {
            "attnscope": _one(each(schema.VERSION.name)) or run.get("attnscope_version"),
            "torch": _one(each(schema.TORCH_VERSION.name)),
            "transformers": _one(each(schema.TRANSFORMERS_VERSION.name)),
            "python": _one(each("process.runtime.version")) or run.get("python"),
        },
        "settings": settings,
        "source": [s for s, present in (("run.json", bool(run)), ("resource", bool(resources)))
                   if present],
    }


def _processes(resources: Sequence[Mapping[str, Any]]) -> int:
    """How many processes wrote: one process has several resources when ``configure()`` changed
    the settings they state (``attnscope.config.*``) while it ran."""
    ids = {(r.get("host.name"), r.get("process.pid"), r.get(schema.PROCESS_START.name))
           for r in resources}
    return len(resources) if (None, None, None) in ids else len(ids)


def _one(values: list[Any]) -> Any:
    """One value, or all of them joined when the processes differ; None when none said."""
    if not values:
        return None
    return values[0] if len(values) == 1 else " / ".join(map(str, values))


def _number(text: str) -> float | int | str:
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text else value


def describe(info: Mapping[str, Any]) -> list[str]:
    """The metadata as short lines for a terminal (nothing for what is unknown)."""
    lines = []
    if info.get("command"):
        when = [f"started {info['started']}"] if info.get("started") else []
        if info.get("duration_s") is not None:
            when.append(f"{info['duration_s']:g} s")
        if info.get("exit_code") is not None:
            when.append(f"exit {info['exit_code']}")
        lines.append(f"run: {_one_line(str(info['command']))}"
                     + (f" ({', '.join(when)})" if when else ""))
    elif info.get("started"):
        lines.append(f"started {info['started']}")
    host = ", ".join(map(str, info.get("hosts") or ()))
    if host:
        arch = ", ".join(map(str, info.get("arch") or ()))
        devices = "; ".join(map(str, info.get("devices") or ()))
        processes = info.get("processes") or 0
        lines.append(f"host: {host}" + (f" ({arch})" if arch else "")
                     + (f" · device: {devices}" if devices else "")
                     + (f" · {processes} processes" if processes > 1 else ""))
    versions = [f"{k} {v}" for k, v in (info.get("versions") or {}).items() if v]
    if versions:
        lines.append("versions: " + ", ".join(versions))
    settings = [f"{k.replace('_', ' ')} {_setting(v)}"
                for k, v in (info.get("settings") or {}).items() if v is not None]
    if settings:
        lines.append("configured: " + ", ".join(settings))
    return lines


_MAX_SHOWN = 160


def _one_line(text: str) -> str:
    """A command as one terminal line: whitespace runs as one space, cut at ``_MAX_SHOWN``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_SHOWN else flat[:_MAX_SHOWN - 1] + "…"


def _setting(value: Any) -> str:
    if isinstance(value, list):
        return " / ".join(_setting(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)
