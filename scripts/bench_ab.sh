#!/usr/bin/env bash
# Two commits' hot path and worker benchmarks, alternated in one run: before/after for a change.
#
#   scripts/bench_ab.sh BEFORE AFTER [PAIRS]    e.g. scripts/bench_ab.sh main HEAD 2
#
# Each commit is exported (git archive) to a temporary directory and run from there with its own
# benchmarks/ and its own attnscope/ first on PYTHONPATH, so neither the work tree nor the
# installed package is what runs. The runs alternate BEFORE, AFTER, BEFORE, AFTER ... (PAIRS
# pairs, default 2) so that a machine's load drifting over the run lands on both sides, each
# pair with its own PYTHONHASHSEED, the same on both sides; the
# lines that carry the ratios are printed per run, then all of each benchmark's output is in
# the directory named at the end. A ratio is compared with a ratio (each benchmark measures its
# reference in the same process); a busy machine widens both sides: look at the load averages
# printed with bench_worker's figures. Needs the environment the benchmarks need (torch,
# OpenTelemetry): run it with the project's python first on PATH, or set PYTHON.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,4p' "$0" >&2
    exit 2
fi
before=$1 after=$2 pairs=${3:-2}
python=${PYTHON:-python}
root=$(git rev-parse --show-toplevel)
out=$(mktemp -d "${TMPDIR:-/tmp}/attnscope-bench-ab.XXXXXX")

for side in before after; do
    ref=${!side}
    mkdir "$out/$side"
    git -C "$root" archive "$(git -C "$root" rev-parse --verify "$ref^{commit}")" \
        | tar -x -C "$out/$side"
    echo "$side: $ref = $(git -C "$root" rev-parse --short "$ref^{commit}")"
done

for ((i = 1; i <= pairs; i++)); do
    for side in before after; do
        for bench in bench_hotpath bench_worker; do
            log="$out/$side.$bench.$i.txt"
            # one hash seed per pair, the same for both sides: the dict layout it makes moves
            # a per-span figure by ~2 µs on its own (docs/benchmarks.md, OTLP export)
            (cd "$out/$side" && PYTHONHASHSEED=$i PYTHONPATH="$out/$side" "$python" \
                "benchmarks/$bench.py" >"$log" 2>&1)
            echo "== $side ($bench, run $i)"
            grep -E '^(unsampled|sampled|  the same|unsampled method)|ratio|load average' "$log" \
                | sed -e 's/^/   /' -e 's/  provider=.*load average/  load average/'
        done
    done
done
echo "all output: $out"
