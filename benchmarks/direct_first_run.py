"""Does building a BERT's OpenVINO graph from its weights (``retrieval/backends/direct.py``) still pay on a first
run? Whole processes on an empty cache, alternating: the default (graph built from the weights and checked against
a numpy forward pass) against the same model's graph exported from torch and checked against torch (the builder
switched off). Each process makes the bi-encoder's document graph and encodes one query; wall seconds and peak
RSS, medians over ``--rounds``. A script, not a test.

    python benchmarks/direct_first_run.py [--rounds 3] [--model DIR] [--out benchmarks/results/direct-first-run.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path


def child(way: str, model: str) -> None:
    """One first run: the document graph made on an empty cache (built from the weights, or exported from torch
    with the builder switched off), then one query encoded."""
    from dataclasses import replace

    import retr.retrieval.encoder as encoder

    if way == "torch":
        encoder.EMBEDDING = replace(encoder.EMBEDDING, build=None)
    enc = encoder.BiEncoder(encoder.EncoderConfig(model=model or None))
    enc.encode_queries(["what do wolves eat"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="")
    p.add_argument("--out", default="benchmarks/results/direct-first-run.json")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    from common import run_measured

    from retr.retrieval.backends.platform import this_platform

    runs: dict[str, list] = {"weights": [], "torch": []}
    for r in range(args.rounds):
        for way in (("weights", "torch") if r % 2 == 0 else ("torch", "weights")):  # alternating order
            tmp = Path(tempfile.mkdtemp(prefix=f"retr-direct-{way}-"))
            try:
                runs[way].append(run_measured(__file__, ["--child", way, args.model], tmp / "log",
                                              env={"RETR_CACHE": str(tmp / "cache")}))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            print(way, runs[way][-1], flush=True)
    med = {w: statistics.median(x["seconds"] for x in v) for w, v in runs.items()}
    rss = {w: statistics.median(x["peak_rss_mb"] for x in v) for w, v in runs.items()}
    result = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "cpu": this_platform().to_dict(), "machine": platform.machine(), "load_average": os.getloadavg(),
              "runs": runs, "median_seconds": med, "median_peak_rss_mb": rss, "torch_over_weights": med["torch"] / med["weights"]}
    print(f"first graph, empty cache, median of {args.rounds}: built from the weights {med['weights']:.1f} s "
          f"({rss['weights']:.0f} MB), exported from torch {med['torch']:.1f} s ({rss['torch']:.0f} MB): "
          f"{result['torch_over_weights']:.2f}x "
          f"(CPU: {result['cpu']['cpu']}, load {result['load_average'][0]:.1f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
