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

mkdir -p "$root"
rows=()
failed=0
for version in "${versions[@]}"; do
    venv="$root/torch-$version"
    log="$root/torch-$version.log"
    want="torch==$version ${deps[*]}"
    install="ok"
    if [ "$(cat "$venv/.compat-spec" 2>/dev/null)" != "$want" ]; then
        echo "== torch $version: building $venv (log: $log)"
        rm -rf "$venv"
        if "$python" -m venv "$venv" >"$log" 2>&1 \
            && "$venv/bin/pip" install -q "torch==$version" "${deps[@]}" >>"$log" 2>&1 \
            && "$venv/bin/pip" install -q --no-deps -e "$here" >>"$log" 2>&1; then
            echo "$want" >"$venv/.compat-spec"
        else
            install="FAILED"
        fi
    else
        : >"$log"
    fi
    if [ "$install" != "ok" ]; then
        rows+=("$version|install failed|-|see $log")
        failed=1
        continue
    fi
    echo "== torch $version: running tests"
    # shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
    (cd "$here" && CUDA_VISIBLE_DEVICES="" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        "${tests[@]}" ${PYTEST_ARGS:-}) >>"$log" 2>&1
    rc=$?
    summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | tr -d '=')"
    actual="$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
    if [ "$rc" -eq 0 ]; then result="PASS"; else result="FAIL (rc $rc)"; failed=1; fi
    rows+=("$version|$result|${actual:-?}|${summary:-no summary, see $log}")
done

echo
printf '%-10s %-14s %-22s %s\n' "torch" "result" "installed" "pytest"
for row in "${rows[@]}"; do
    IFS='|' read -r v r a s <<<"$row"
    printf '%-10s %-14s %-22s %s\n' "$v" "$r" "$a" "$s"
done
for version in "${versions[@]}"; do
    grep -E '^(FAILED|ERROR) ' "$root/torch-$version.log" 2>/dev/null | sed -e 's/ - .*//' \
        -e "s/^/  $version  /"
done
echo "logs: $root/torch-<version>.log"
exit "$failed"
