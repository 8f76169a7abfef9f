"""What a search process pays to open its query graph once `retr doctor --export` has made every graph: the time
from an opened encoder to its first query's vector, and the memory that adds, in a fresh process each time.

    RETR_CACHE=C python benchmarks/query_open.py [--rounds 2] [--peer-path DIR]
                                                 [--out benchmarks/results/query-open.json]

``C`` is a cache holding the model's graphs (run `retr doctor --export` on it first) and a stored query choice.
``--peer-path`` names a folder holding another checkout as ``retr`` (``PYTHONPATH``): it is measured in the same
rounds, alternating, so a shared machine's drift falls on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import cpu, write_result

_CHILD = """
import json, time
def status(key):
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith(key))) / 1024
from retr.retrieval.encoder import BiEncoder, EncoderConfig
enc = BiEncoder(EncoderConfig())
enc.graph
before = status("VmRSS")
t0 = time.perf_counter()
enc.encode_query("what causes the northern lights")
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "added_mib": status("VmRSS") - before, "peak_mib": status("VmHWM"),
                  "candidates": list(enc.query_graphs.candidates), "query_graph": enc.describe_queries()}))
"""


def measure(pythonpath: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath or ""}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True,
                         cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peer-path", default=None, help="a folder holding another checkout as `retr` (PYTHONPATH)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "query-open.json"))
    args = ap.parse_args(argv)
    import retr

    builds = {"this": None, **({"peer": args.peer_path} if args.peer_path else {})}
    runs: dict[str, list] = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, path in builds.items():
            runs[name].append(measure(path))
            r = runs[name][-1]
            print(f"{name}: first query {r['seconds']:.2f} s, +{r['added_mib']:.0f} MiB (peak {r['peak_mib']:.0f} "
                  f"MiB); candidates {r['candidates']}", flush=True)
    write_result(args.out, {"cpu": cpu(), "cache": os.environ.get("RETR_CACHE"),
                            "retr": str(Path(next(iter(retr.__path__))).resolve()),
                            "peer_path": args.peer_path, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
