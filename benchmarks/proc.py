"""Kept for benchmarks/speed.py and benchmarks/serve_load.py until they import from ``common`` (the one module of
the benchmarks' shared helpers): the same functions, not a copy."""

from common import command_line, run_measured, write_result

__all__ = ["command_line", "run_measured", "write_result"]
