"""Where spans and metrics go: providers and exporters (the pipeline), metrics, file formats."""
