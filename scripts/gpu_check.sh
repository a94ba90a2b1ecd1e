#!/usr/bin/env bash
# The GPU acceptance run (issue 36 §5): every CUDA claim's test and benchmark, one JSON of figures,
# under 5 minutes on one GPU. The work is scripts/gpu_check.py's; its docstring lists the steps.
#
#   OUT=/tmp/gpu scripts/gpu_check.sh              # gpu_check.json, gpu_check.log, JUnit files
#   OUT=/tmp/gpu scripts/gpu_check.sh --steps env,tests,bench,compile
#
# On the lent GPU machine (no OpenTelemetry there, no network): scripts/gpu_wheels.sh here first,
# then the command docs/benchmarks.md ("CUDA: the acceptance run") gives.
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python || command -v python3)}"
exec "$PY" scripts/gpu_check.py ${OUT:+--out "$OUT"} "$@"
