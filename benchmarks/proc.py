"""One measured process: its whole wall time, seen from outside, and its own peak RSS.

The child reports its own high-water mark (VmHWM, the peak RSS of its own address space). The kernel's rusage
maxrss of a child is not usable: it keeps the high-water mark of the memory the child was forked from (a parent
that has just held a large corpus), so it can read the same for every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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
runpy.run_path(target, run_name="__main__")
"""


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
