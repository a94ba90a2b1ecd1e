#!/usr/bin/env bash
# Wheels for the lent GPU machine, which has torch, transformers, psutil, grpcio and requests but
# no OpenTelemetry and no structlog, and no network: the versions this environment runs, for its
# Python 3.12, into .whl/ (ignored by git through .git/info/exclude). Run here, once, then name
# .whl in the device call's carry (docs/benchmarks.md, "CUDA: the acceptance run").
#
#   scripts/gpu_wheels.sh            # PYTHON=... to read the versions from another environment
set -eu
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
names=(opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto
       opentelemetry-exporter-otlp opentelemetry-exporter-otlp-proto-grpc
       opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-common
       opentelemetry-exporter-otlp-common opentelemetry-exporter-http-transport
       googleapis-common-protos protobuf structlog)
pins=()
for name in "${names[@]}"; do
  version="$("$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")"
  [ -n "$version" ] && pins+=("$name==$version")   # a package this environment lacks is not needed
done
rm -rf .whl && mkdir .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
ls .whl
du -sh .whl
