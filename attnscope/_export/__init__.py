"""Where spans and metrics go: providers and exporters (the pipeline), metrics, file formats."""

from .otel_env import import_sdk_trace

import_sdk_trace()  # first: every module of the package imports the SDK's trace module
