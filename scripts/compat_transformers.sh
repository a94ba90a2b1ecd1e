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

mkdir -p "$root"
rows=()
failed=0
for version in "${versions[@]}"; do
    venv="$root/tf-$version"
    log="$root/tf-$version.log"
    want="torch==$torch_version transformers==$version ${deps[*]}"
    install="ok"
    if [ "$(cat "$venv/.compat-spec" 2>/dev/null)" != "$want" ]; then
        echo "== transformers $version: building $venv (log: $log)"
        rm -rf "$venv"
        if "$python" -m venv "$venv" >"$log" 2>&1 \
            && "$venv/bin/pip" install -q "torch==$torch_version" "transformers==$version" \
                "${deps[@]}" >>"$log" 2>&1 \
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
    echo "== transformers $version: running tests"
    # shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
    (cd "$here" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" \
        ${PYTEST_ARGS:-}) >>"$log" 2>&1
    rc=$?
    summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | tr -d '=')"
    actual="$("$venv/bin/python" -c 'import torch, transformers as t; print(t.__version__, torch.__version__)' 2>/dev/null)"
    if [ "$rc" -eq 0 ]; then result="PASS"; else result="FAIL (rc $rc)"; failed=1; fi
    rows+=("$version|$result|${actual:-?}|${summary:-no summary, see $log}")
done

echo
printf '%-12s %-14s %-28s %s\n' "transformers" "result" "installed (tf, torch)" "pytest"
for row in "${rows[@]}"; do
    IFS='|' read -r v r a s <<<"$row"
    printf '%-12s %-14s %-28s %s\n' "$v" "$r" "$a" "$s"
done
for version in "${versions[@]}"; do
    grep -E '^(FAILED|ERROR) ' "$root/tf-$version.log" 2>/dev/null | sed -e 's/ - .*//' \
        -e "s/^/  $version  /"
done
echo "logs: $root/tf-<version>.log"
exit "$failed"
