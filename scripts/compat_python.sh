#!/usr/bin/env bash
# The whole test suite (the README's test line) under other Python versions than the CI's, one
# virtualenv per interpreter, one after the other; prints a pass/fail table. For people and a
# scheduled job (torch comes from the registry as a CUDA build for other Pythons than 3.11: about a
# minute and 5 GB each), not for the per-commit CI.
#
#   scripts/compat_python.sh                 # 3.10 (the declared floor), 3.12, 3.13
#   scripts/compat_python.sh 3.10 3.13       # just these
#
# An interpreter is found as pythonX.Y on PATH, else in pyenv ($PYENV_ROOT/versions/X.Y*).
# pip picks each Python's newest transformers that installs there (3.10: 5.20.2, not the CI's).
# Environment: COMPAT_VENVS (where the virtualenvs live, default /tmp/attnscope-compat; kept
# between runs, rebuilt when what they should hold changes), TORCH_VERSION (default 2.13.0),
# PYTEST_ARGS (added to every pytest run, e.g. "-x").
set -u

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${COMPAT_VENVS:-/tmp/attnscope-compat}"
torch_version="${TORCH_VERSION:-2.13.0}"
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=(3.10 3.12 3.13); fi

interpreter() {
    # one that runs: a pyenv shim is on PATH for every version pyenv has, selected or not
    local found
    for found in "$(command -v "python$1" 2>/dev/null)" \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python"$1"; do
        if [ -x "$found" ] && "$found" -c '' >/dev/null 2>&1; then
            echo "$found"
            return
        fi
    done
    return 1
}

rows=()
failed=0
mkdir -p "$root"
for version in "${versions[@]}"; do
    venv="$root/python-$version"
    log="$root/python-$version.log"
    if ! python="$(interpreter "$version")"; then
        rows+=("$version|no interpreter|-|-")
        failed=1
        continue
    fi
    want="$python torch==$torch_version $(git -C "$here" rev-parse HEAD:pyproject.toml 2>/dev/null)"
    if [ "$(cat "$venv/.compat-spec" 2>/dev/null)" != "$want" ]; then
        echo "== Python $version: building $venv (log: $log)"
        rm -rf "$venv"
        if ! { "$python" -m venv "$venv" >"$log" 2>&1 \
            && "$venv/bin/pip" install -q "torch==$torch_version" >>"$log" 2>&1 \
            && "$venv/bin/pip" install -q -e "$here[test]" >>"$log" 2>&1; }; then
            rows+=("$version|install failed|-|see $log")
            failed=1
            continue
        fi
        echo "$want" >"$venv/.compat-spec"
    else
        : >"$log"
    fi
    echo "== Python $version: running the suite"
    # shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
    (cd "$here" && "$venv/bin/python" -m pytest -n auto --dist loadfile -q -p no:cacheprovider \
        ${PYTEST_ARGS:-}) >>"$log" 2>&1
    rc=$?
    summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | tr -d '=')"
    actual="$("$venv/bin/python" -c 'import platform, torch, transformers
print(platform.python_version(), "transformers", transformers.__version__)' 2>/dev/null)"
    if [ "$rc" -eq 0 ]; then result="PASS"; else result="FAIL (rc $rc)"; failed=1; fi
    rows+=("$version|$result|${actual:-?}|${summary:-no summary, see $log}")
done

echo
printf '%-8s %-14s %-32s %s\n' "python" "result" "installed" "pytest"
for row in "${rows[@]}"; do
    IFS='|' read -r v r a s <<<"$row"
    printf '%-8s %-14s %-32s %s\n' "$v" "$r" "$a" "$s"
done
for version in "${versions[@]}"; do
    grep -E '^(FAILED|ERROR) ' "$root/python-$version.log" 2>/dev/null | sed -e 's/ - .*//' \
        -e "s/^/  $version  /"
done
echo "logs: $root/python-<version>.log"
exit "$failed"
