"""One query through `retr search`, the whole process a user runs, each time a fresh one: wall time and peak RSS,
alternating with another build (``--peer-path``) so that a shared machine's drift falls on both sides.

    python benchmarks/search_process.py --cache C --index I [--rounds 6] [--peer-path DIR]
                                        [--out benchmarks/results/search-process.json]

``C`` is a cache holding the model's graphs and ``I`` an index built with it (a path, or relative to ``C``). Each
build gets its own copy of ``C`` (the two may keep different things in it); the first ``--warm`` searches of each
are not counted (the query graph's choice, and the search that keeps its compiled model). ``--peer-path`` names a
folder holding another checkout as ``retr`` (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from common import command_line, cpu, run_measured, write_result

QUERIES = ("does vitamin d prevent fractures", "statins and cancer risk", "microRNA regulation of the cell cycle",
           "obesity and insulin resistance", "BRCA1 mutations in breast cancer", "smoking and lung function")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, help="a cache holding the model's graphs")
    ap.add_argument("--index", required=True, help="an index built with that cache (a path, or relative to it)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--warm", type=int, default=2, help="searches of each build not counted, first")
    ap.add_argument("--peer-path", default=None, help="a folder holding another checkout as `retr` (PYTHONPATH)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "search-process.json"))
    args = ap.parse_args(argv)

    builds = {"this": None, **({"peer": args.peer_path} if args.peer_path else {})}
    work = Path(tempfile.mkdtemp(prefix="retr-search-process-"))
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    try:
        caches = {}
        for name in builds:
            caches[name] = work / f"cache-{name}"
            shutil.copytree(args.cache, caches[name], symlinks=True)
        for i in range(args.warm + args.rounds):
            for name, path in builds.items():
                index = Path(args.index)
                index = index if index.is_absolute() else caches[name] / index
                env = {"RETR_CACHE": str(caches[name]), "PYTHONPATH": path or ""}
                got = run_measured("retr", ["search", str(index), QUERIES[i % len(QUERIES)], "-k", "3"],
                                   work / f"{name}-{i}.log", env=env)
                if i >= args.warm:
                    runs[name].append(got)
                print(f"{name:5s} {i}: {got['seconds']:.2f} s, {got['peak_rss_mb']:.0f} MiB"
                      + ("" if i >= args.warm else " (warm-up)"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {name: {"median_s": statistics.median(r["seconds"] for r in rs),
                      "min_s": min(r["seconds"] for r in rs), "max_s": max(r["seconds"] for r in rs),
                      "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs)}
               for name, rs in runs.items()}
    for name, s in summary.items():
        print(f"{name}: median {s['median_s']:.2f} s ({s['min_s']:.2f}-{s['max_s']:.2f}), "
              f"peak RSS {s['median_peak_rss_mb']:.0f} MiB")
    if "peer" in summary:
        print(f"this / peer, median wall: {summary['this']['median_s'] / summary['peer']['median_s']:.3f}")
    write_result(args.out, {"command": command_line(), "cpu": cpu(), "index": args.index, "rounds": args.rounds,
                            "warm": args.warm, "peer_path": args.peer_path, "summary": summary, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
