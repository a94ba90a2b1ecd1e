"""What the tests share: span helpers, trace-file builders, the architecture sweep, job scripts."""
