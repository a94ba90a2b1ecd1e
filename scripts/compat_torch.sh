#!/usr/bin/env bash
# attnscope's core, profile-tier and fallback tests against torch releases on CPU, one virtualenv
# per release, one release after the other; prints a pass/fail table. For people and a scheduled
# job (other releases than the CI's come from the registry as large CUDA builds: minutes and
# gigabytes each), not for the per-commit CI.
#
#   scripts/compat_torch.sh                    # the declared floor, 2.11 (the GPU machine's), the newest
#   scripts/compat_torch.sh 2.5.1 2.14.1       # just these
#
# Environment: COMPAT_VENVS (where the virtualenvs live, default /tmp/attnscope-compat; kept
# between runs, rebuilt when what they should hold changes), PYTHON (the interpreter that makes
# the virtualenvs, default python3), PYTEST_ARGS (added to every pytest run, e.g. "-x").
set -u

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${COMPAT_VENVS:-/tmp/attnscope-compat}"
python="${PYTHON:-python3}"
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=(2.3.1 2.11.0 2.15.0); fi
tests=(
    # the core: decorator, blocks, sampling, timing, the worker's spans
    tests/test_trace.py
    tests/test_timing.py
    tests/test_sampling.py
    tests/test_emit.py
    tests/test_safety.py
    # the profile tier: the profiler session, its events, kernels and operators
    tests/test_profile.py
    tests/test_kineto_events.py
    tests/test_kernels.py
    tests/test_optree.py
    # fallback verdicts
    tests/test_fallback.py
    tests/test_fallback_device.py
    tests/test_fallback_traced.py
)
# attnscope's dependencies and what these tests import; attnscope itself goes in editable and
# without dependencies, so torch is the only thing that differs from one virtualenv to the next
deps=("numpy<3" "opentelemetry-api>=1.24" "opentelemetry-sdk>=1.24" "opentelemetry-exporter-otlp>=1.24"
    "opentelemetry-proto>=1.24" "opentelemetry-exporter-prometheus>=0.45b0" "psutil>=5.9"
    "structlog>=23.1" "pytest>=8" "hypothesis>=6" "rich>=13" "matplotlib>=3.7" "scipy>=1.10"
    "transformers>=4.57")

kind=torch
prefix=torch
specs() { echo "torch==$1"; }
probe='import torch; print(torch.__version__)'
pytest_env='CUDA_VISIBLE_DEVICES='
# shellcheck source=scripts/_compat_loop.sh
. "$here/scripts/_compat_loop.sh"
