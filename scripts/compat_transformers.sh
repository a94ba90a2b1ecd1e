#!/usr/bin/env bash
# attnscope's transformers tests against older transformers releases, one virtualenv per release,
# one release after the other; prints a pass/fail table. For people and a scheduled job (it
# installs packages and takes minutes per release), not for the per-commit CI.
#
#   scripts/compat_transformers.sh                  # the releases below
#   scripts/compat_transformers.sh 4.44.2 4.57.6    # just these
#
# Environment: COMPAT_VENVS (where the virtualenvs live, default /tmp/attnscope-compat; kept
# between runs, rebuilt when what they should hold changes), TORCH_VERSION (default 2.13.0),
# PYTHON (the interpreter that makes the virtualenvs, default python3), PYTEST_ARGS (added to
# every pytest run, e.g. "-x -k gpt2").
set -u

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${COMPAT_VENVS:-/tmp/attnscope-compat}"
torch_version="${TORCH_VERSION:-2.13.0}"
python="${PYTHON:-python3}"
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=(4.44.2 4.48.3 4.51.3 4.57.6); fi
tests=(
    tests/test_instrument_transformers.py
    tests/test_legacy_caches.py
    tests/test_arch_exactness.py
    tests/test_mask_exactness.py
)
# attnscope's own dependencies and its tests' (pyproject: dependencies, the test extra's few that
# these tests import); attnscope itself goes in editable and without dependencies, so the
# transformers release is the only thing that differs from one virtualenv to the next.
deps=(numpy "opentelemetry-api>=1.24" "opentelemetry-sdk>=1.24" "opentelemetry-exporter-otlp>=1.24"
    "opentelemetry-proto>=1.24" "psutil>=5.9" "structlog>=23.1" "pytest>=8" "hypothesis>=6")

kind=transformers
prefix=tf
specs() { echo "torch==$torch_version transformers==$1"; }
probe='import torch, transformers as t; print(t.__version__, torch.__version__)'
pytest_env=''
# shellcheck source=scripts/_compat_loop.sh
. "$here/scripts/_compat_loop.sh"
