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

kind=python
prefix=python
specs() { echo "torch==$torch_version"; }
python_for() { interpreter "$1"; }
# attnscope with its test extra, from this tree: each Python's own pick of the rest
deps=(-e "$here[test]")
tests=(-n auto --dist loadfile)  # the README's test line: the whole suite
probe='import platform, transformers; print(platform.python_version(), "transformers", transformers.__version__)'
pytest_env=''
python=python3  # unused: python_for names each version's
# shellcheck source=scripts/_compat_loop.sh
. "$here/scripts/_compat_loop.sh"
