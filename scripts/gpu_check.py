"""The GPU acceptance run: every CUDA claim's test and benchmark, one JSON of figures.

    python scripts/gpu_check.py --out DIR            # or: OUT=DIR scripts/gpu_check.sh
    python scripts/gpu_check.py --out DIR --steps tests,compile

Steps (``--steps``, comma-separated; default ``env,tests,bench``):

- ``env``: torch, CUDA, the device, cuDNN, the driver.
- ``tests``: ``tests/gpu`` (CUDA graphs of ``torch.compile`` apart) and the CUDA half of
  ``tests/test_device_acceptance.py`` — timing tier without host syncs; profile tier kernels and
  backend for naive/math/efficient/flash/cuDNN; exact FLOPs on causal, grouped-query and
  sliding-window calls per backend; fallback verdicts; device mask counts; ``device_ns`` within 2%
  of the test's own events; memory peaks against the allocator; CUDA graph replays.
- ``bench``: ``bench_profile.py`` (first vs later profiled call, timing-tier cost, kernels and
  backend per variant), ``bench_mask_reduce.py`` (a masked call's launches and host time),
  ``bench_graph_replay.py`` (a replay's host cost and the event nodes' device cost).
- ``compile`` (opt-in, up to 8 minutes: five inductor compiles):
  ``tests/gpu/test_graph_compile.py``.
- ``issue37`` (opt-in, a run of its own: ``--steps env,issue37``): issue 37's CUDA figures on its
  Llama (16 layers, hidden 2048, bf16, batch 8, 128-token prompt, 32 new tokens) — where a
  process's first sampled calls spend their time, step by step, and whether the profiler's
  warm-up freezes the calling thread (``bench_first_use.py``, written to
  ``bench_first_use_cuda.json``); the first ``generate()`` of a process at production defaults
  (``bench_first_call.py``); every call traced with metrics off (``--breakdown``: each
  calling-thread step's time in place) and on; the production defaults, unpadded and
  left-padded (``bench_model.py``; the padded run prints the realised sample rate). Its steps ask
  for 820 s: give it ``--budget 590`` and a device timeout of 600.

Each step has its own timeout, cut to what is left of ``--budget`` seconds (default 480: a device
command may run 10 minutes); a failing step does not stop the next. ``DIR`` receives
``gpu_check.json`` (status, environment, steps, test outcomes, the tests' figures, the benchmarks'
figures), ``gpu_check.log`` (everything printed), the tests' JUnit files and
``bench_profile_cuda.json``. Exit status: 0 every step passed on CUDA, 1 a step failed, 2 no CUDA
device (not an acceptance run: the CUDA tests skip; the JSON says so).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES_ENV = "ATTNSCOPE_DEVICE_FIGURES"  # tests/support/figures.py
STEPS = ("env", "tests", "bench", "compile", "issue37")
DEFAULT_STEPS = ("env", "tests", "bench")
_TAIL = 6000  # characters of a step's output kept in the JSON


def junit_summary(path: Path) -> dict[str, Any]:
    """Outcome counts of a JUnit XML file, with each failure's and skip's test id and message."""
    out: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                           "failures": [], "skips": []}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        out["unreadable"] = f"{path.name}: {exc}"
        return out
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None or error is not None:
            node = failure if failure is not None else error
            out["failed" if failure is not None else "errors"] += 1
            out["failures"].append({"id": test_id,
                                    "message": (node.get("message") or "")[:500]})  # type: ignore[union-attr]
        elif skipped is not None:
            out["skipped"] += 1
            out["skips"].append({"id": test_id, "reason": (skipped.get("message") or "")[:300]})
        else:
            out["passed"] += 1
    return out


def merge_summaries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                             "failures": [], "skips": []}
    for part in parts:
        for key in ("passed", "failed", "errors", "skipped"):
            total[key] += part.get(key, 0)
        total["failures"] += part.get("failures", [])
        total["skips"] += part.get("skips", [])
        if "unreadable" in part:
            total.setdefault("unreadable", []).append(part["unreadable"])
    return total


def read_figures(path: Path) -> list[dict[str, Any]]:
    """The tests' figure lines (a line that is not a JSON object is kept as text)."""
    if not path.exists():
        return []
    found: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        found.append(value if isinstance(value, dict) else {"check": "unreadable", "line": line})
    return found


class Run:
    """The steps' bookkeeping: a shared deadline, a log, and the JSON document."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.deadline = time.monotonic() + budget_s
        self.log = (out / "gpu_check.log").open("w", encoding="utf-8")
        self.doc: dict[str, Any] = {
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "steps": [], "environment": {}, "tests": {}, "figures": [], "benchmarks": {}}

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def command(self, name: str, argv: list[str], timeout_s: float,
                env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run ``argv`` from the repository root; its output goes to the terminal and the log."""
        left = self.deadline - time.monotonic()
        step: dict[str, Any] = {"name": name, "command": " ".join(argv)}
        self.doc["steps"].append(step)
        if left < 10:
            step.update(rc=None, not_run="the run's time budget is spent")
            self.say(f"== {name}: not run (the time budget is spent)")
            return step
        limit = min(timeout_s, left)
        self.say(f"\n== {name}  (timeout {limit:.0f} s)\n$ {step['command']}")
        t0 = time.monotonic()
        try:
            done = subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=limit, check=False)
            text, rc, timed_out = done.stdout, done.returncode, False
        except subprocess.TimeoutExpired as exc:
            raw = exc.stdout or ""
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            rc, timed_out = None, True
        self.say(text.rstrip())
        step.update(rc=rc, timed_out=timed_out, seconds=round(time.monotonic() - t0, 1),
                    output_tail=text[-_TAIL:])
        self.say(f"== {name}: rc {rc}{' (timed out)' if timed_out else ''}, "
                 f"{step['seconds']} s")
        return step


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if env["cuda_available"]:
        env["device"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["cudnn"] = torch.backends.cudnn.version()
        env["memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=False)
        env["nvidia_smi"] = smi.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        env["nvidia_smi"] = None
    return env


def _tests(run: Run, py: str) -> None:
    figures = run.out / "figures.jsonl"
    figures.unlink(missing_ok=True)
    env = {FIGURES_ENV: str(figures)}
    common = [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    parts = []
    gpu_xml, acc_xml = run.out / "pytest_gpu.xml", run.out / "pytest_device_acceptance.xml"
    run.command("tests/gpu", [*common, "tests/gpu", "--ignore", "tests/gpu/test_graph_compile.py",
                              "--junitxml", str(gpu_xml)], 270, env)
    parts.append(junit_summary(gpu_xml))
    run.command("tests/test_device_acceptance.py (cuda)",
                [*common, "tests/test_device_acceptance.py", "-k", "cuda",
                 "--junitxml", str(acc_xml)], 120, env)
    parts.append(junit_summary(acc_xml))
    run.doc["tests"] = merge_summaries(parts)
    run.doc["figures"] = read_figures(figures)


def _compile(run: Run, py: str) -> None:
    xml = run.out / "pytest_gpu_compile.xml"
    run.command("tests/gpu/test_graph_compile.py", [
        py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
        "tests/gpu/test_graph_compile.py", "--junitxml", str(xml)], 480)
    run.doc["tests"] = merge_summaries([run.doc.get("tests") or {}, junit_summary(xml)])


def _with_json(run: Run, name: str, argv: list[str], limit: float, json_name: str,
               output: bool = True) -> None:
    """A benchmark run with ``--json`` into ``DIR/json_name``: its figures kept under ``name``."""
    path = run.out / json_name
    step = run.command(name, [*argv, "--json", str(path)], limit)
    found: dict[str, Any] = {"rc": step.get("rc")}
    if output:
        found["output"] = step.get("output_tail")
    if path.exists():
        try:
            found["figures"] = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            found["unreadable"] = str(exc)
    run.doc["benchmarks"][name] = found


def _bench(run: Run, py: str) -> None:
    _with_json(run, "bench_profile", [py, "benchmarks/bench_profile.py", "--device", "cuda",
                                      "--runs", "3", "-n", "200"], 150, "bench_profile_cuda.json",
               output=False)
    for name, argv, limit in (
            ("bench_mask_reduce", [py, "benchmarks/bench_mask_reduce.py", "--device", "cuda"], 90),
            ("bench_graph_replay", [py, "benchmarks/bench_graph_replay.py", "--device", "cuda"],
             120)):
        step = run.command(name, argv, limit)
        run.doc["benchmarks"][name] = {"rc": step.get("rc"), "output": step.get("output_tail")}


def _issue37(run: Run, py: str) -> None:
    # goal 1's first-use costs step by step, first: a fresh process, what the later steps pay
    _with_json(run, "issue37 first-use probe", [py, "benchmarks/bench_first_use.py", "--device",
                                                "cuda"], 90, "bench_first_use_cuda.json")
    first = [py, "benchmarks/bench_first_call.py", "--generate", "32", "--model", "issue37",
             "--device", "cuda", "--runs", "2", "--generates", "3"]
    model = [py, "benchmarks/bench_model.py", "--model", "issue37", "--device", "cuda"]
    for name, argv, limit in (
            ("issue37 first generate()", first, 250),  # 4 modes x 2 processes
            ("issue37 every call, metrics off", [*model, "--every-call", "--pairs", "20",
                                                  "--metrics", "off", "--breakdown", "3"], 130),
            ("issue37 every call, metrics on", [*model, "--every-call", "--pairs", "20",
                                                 "--metrics", "on"], 100),
            ("issue37 defaults", [*model, "--generate", "32", "--pairs", "60"], 150),
            # a batched server's left-padded batch: does the budget thin the sample (goal 5)?
            ("issue37 defaults, left-padded", [*model, "--generate", "32", "--padded",
                                               "--pairs", "60"], 150)):
        step = run.command(name, argv, limit)
        run.doc["benchmarks"][name] = {"rc": step.get("rc"), "output": step.get("output_tail")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out",
                        help="directory for gpu_check.json and the rest (default: $OUT)")
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                        help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds for the whole run; each step gets what is left")
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}: choose from {', '.join(STEPS)}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, args.budget)
    t0 = time.monotonic()
    env = environment()
    run.doc["environment"] = env
    run.say("== environment\n" + json.dumps(env, indent=1))
    py = sys.executable
    cuda = bool(env["cuda_available"])
    if "tests" in steps:
        _tests(run, py)
    if "compile" in steps:
        _compile(run, py)
    for name, bench in (("bench", _bench), ("issue37", _issue37)):
        if name not in steps:
            continue
        if cuda:
            bench(run, py)
        else:
            run.say(f"\n== {name}: no CUDA device, benchmarks not run")
    failed = [s["name"] for s in run.doc["steps"] if s.get("rc") != 0]
    tests = run.doc.get("tests") or {}
    if not cuda:
        status = "no-cuda"
    elif failed or tests.get("failed") or tests.get("errors"):
        status = "fail"
    else:
        status = "pass"
    run.doc.update(status=status, failed_steps=failed, seconds=round(time.monotonic() - t0, 1))
    (out / "gpu_check.json").write_text(json.dumps(run.doc, indent=1, default=str) + "\n",
                                        encoding="utf-8")
    run.say(f"\n== done: {status}  ({run.doc['seconds']} s; {out / 'gpu_check.json'})")
    if tests:
        run.say(f"   tests: {tests['passed']} passed, {tests['failed']} failed, "
                f"{tests['errors']} errors, {tests['skipped']} skipped")
    run.log.close()
    return {"pass": 0, "fail": 1}.get(status, 2)


if __name__ == "__main__":
    sys.exit(main())
