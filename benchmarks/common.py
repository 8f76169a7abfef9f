"""What the benchmarks share: latency percentiles, text tables, measured child processes, the CPU a figure was
measured on, and writing a result file.

Benchmarks are scripts, run as ``python benchmarks/NAME.py ...``: Python puts ``benchmarks/`` first on the path, so
each imports these with ``from common import ...`` (no ``sys.path`` edits). No test imports a benchmark: what a test
needs lives in the ``retr`` package.

Child processes: ``run_measured`` runs ``retr ARGS`` or a script and reports its whole wall time and its own peak
RSS. The child reports its own high-water mark (VmHWM, the peak RSS of its own address space); the kernel's rusage
maxrss of a child is not usable, as it keeps the high-water mark of the memory the child was forked from (a parent
that has just held a large corpus), so it can read the same for every run. ``run_child`` runs a script's own
``--child`` mode and reads the JSON it prints last.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

_WRAP = """import atexit, runpy, sys
def hwm(path):
    with open("/proc/self/status") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM"))
    with open(path, "w") as out:
        out.write(str(kb))
atexit.register(hwm, sys.argv[1])
target, sys.argv = sys.argv[2], sys.argv[2:]
if target == "retr":
    from retr.cli.main import main
    sys.exit(main(sys.argv[1:]))
import os
sys.path.insert(0, os.path.dirname(os.path.abspath(target)))  # as `python SCRIPT` does: its folder first
runpy.run_path(target, run_name="__main__")
"""


def percentiles(samples: Sequence[float], scale: float = 1.0) -> dict:
    """retr eval's latency percentiles (``retr.eval.report.Percentiles``: p50/p95/p99/mean/n, in ms) of
    ``samples`` times ``scale`` (1000.0 for samples in seconds); None for each where there is no sample."""
    from retr.eval.report import Percentiles

    if not len(samples):
        return {"p50": None, "p95": None, "p99": None, "mean": None, "n": 0}
    return asdict(Percentiles.of([scale * float(s) for s in samples]))


def table(title: str, header: list[str], rows: list[list]) -> str:
    """A right-aligned text table under ``title``; floats to 4 significant digits."""
    cells = [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def cpu() -> str:
    """The CPU figures were measured on, as a result file and a report name it: its model name and cores (the
    ``Platform`` retr resolves, so a result and retr's own choices name the same CPU)."""
    try:
        from retr.retrieval.backends.platform import this_platform
    except ImportError:  # an older checkout measured beside this one (PYTHONPATH): the model name as it is read
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor())
        return f"{model}, {os.cpu_count()} cores"
    here = this_platform()
    return f"{here.cpu}, {here.cores} cores"


def run_measured(target: str, args: list[str], log: Path, env: dict | None = None) -> dict:
    """Run ``retr ARGS`` (``target`` "retr") or the script ``target`` with ``args`` in a fresh Python process;
    {"seconds": whole-process wall, "peak_rss_mb": its VmHWM}. A failure ends the benchmark with its log's tail."""
    log = Path(log)
    hwm = log.with_suffix(".hwm")
    t0 = time.perf_counter()
    with open(log, "w") as err:  # a file, not a pipe: a full pipe would stall the child
        proc = subprocess.run([sys.executable, "-c", _WRAP, str(hwm), target, *args], stdout=subprocess.DEVNULL,
                              stderr=err, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{target} {' '.join(args)} failed ({proc.returncode}):\n{log.read_text()[-2000:]}")
    return {"seconds": seconds, "peak_rss_mb": int(hwm.read_text()) / 1024}


def run_child(script: str | Path, args: Sequence[str], env: dict | None = None):
    """Run ``python SCRIPT --child ARGS`` in a fresh process and return the JSON value its last stdout line holds.
    A failure ends the benchmark with the child's stderr tail."""
    proc = subprocess.run([sys.executable, str(script), "--child", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode:
        raise SystemExit(f"{Path(script).name} --child {' '.join(args)} failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def command_line() -> str:
    """The command that started this benchmark, as a reader would type it again (``python script.py args``)."""
    return " ".join([Path(sys.executable).name, *sys.argv])


def write_result(out: str | Path, result: dict, say: bool = True) -> Path:
    """A benchmark's result as JSON at ``out`` (folders made; written whole, then renamed into place: never half
    a file), numpy numbers as floats; ``say``: print where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=float) + "\n")
    tmp.replace(path)
    if say:
        print(f"results written to {path}")
    return path
