#!/usr/bin/env bash
# attnscope's export tests against OpenTelemetry releases (api, sdk, OTLP exporters and proto at
# one version), one virtualenv per release; prints a pass/fail table. The OTLP encoders
# (_export/otlp_encode.py, otlp_json_text.py) must write what each release's own encoder writes,
# or step aside: this is where a release that changed its encoding shows. For people and a
# scheduled job (releases come from the registry), not for the per-commit CI.
#
#   scripts/compat_otel.sh                  # the declared floor, 1.24.0, and 1.45.2
#   scripts/compat_otel.sh 1.30.0           # just this one
#
# Environment: COMPAT_VENVS (default /tmp/attnscope-compat), PYTHON (default python3),
# PYTEST_ARGS (added to every pytest run, e.g. "-x").
set -u

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${COMPAT_VENVS:-/tmp/attnscope-compat}"
python="${PYTHON:-python3}"
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=(1.24.0 1.45.2); fi
tests=(
    # the encoders, byte for byte against the release's own, and the exporters built with them
    tests/test_otlp_encode.py
    tests/test_otlp_json_text.py
    tests/test_jaeger_span_text.py
    # exporters by name and variable, the emitter, the files
    tests/test_destinations.py
    tests/test_emit.py
    tests/test_otlp_json.py
    tests/test_jaeger_json.py
    # the API's current-context ContextVar, read straight on a sampled call (else get_current())
    tests/test_sampling_context.py
)
deps=("torch==2.13.0" "numpy<3" "psutil>=5.9" "structlog>=23.1" "pytest>=8" "hypothesis>=6"
    "transformers>=4.57")

kind=opentelemetry
prefix=otel
specs() {
    echo "opentelemetry-api==$1 opentelemetry-sdk==$1 opentelemetry-exporter-otlp==$1" \
        "opentelemetry-proto==$1"
}
probe='from opentelemetry.sdk.version import __version__; print(__version__)'
pytest_env=''
# shellcheck source=scripts/_compat_loop.sh
. "$here/scripts/_compat_loop.sh"
