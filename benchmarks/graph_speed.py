"""Documents per second of each document graph on this CPU: the same texts, the backends alternating.

Whether static int8 pays depends on the CPU: with int8 dot products (AVX-512 VNNI, AVX-VNNI) it is the fastest
graph; with AVX2 alone it can be slower than the base graph, and with AMX no faster than bf16. retr prunes it
without int8 dot products (``chooser.prune``) and otherwise calibrates only where a corpus's measured saving
beats the calibration's cost (``cost.calibration_pays``). This script measures the speeds behind that choice
on the machine it runs on: each backend's graph is forced (``RETR_INT8_DOT=1``) so that int8 is timed even where
retr would not use it. One process, graphs exported and warmed before timing, ``--rounds`` passes over ``--docs``
SciFact documents, backends alternating within each pass so that drift on a shared machine falls on all of them;
the median pass is reported.

    python benchmarks/graph_speed.py [--docs 300] [--rounds 3]
        [--backends openvino,openvino-int8,openvino-int8-ffn,onnx-int8,torch] --out benchmarks/results/graph-speed.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--docs", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", default="openvino,openvino-int8,openvino-int8-ffn,onnx-int8,torch")
    p.add_argument("--out", default="benchmarks/results/graph-speed.json")
    args = p.parse_args(argv)

    from retr.eval.data import load_dataset
    from retr.retrieval.artifacts import versions
    from retr.retrieval.backends.platform import this_platform
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    cpu = this_platform().to_dict()  # as this CPU reads, before int8 is forced below
    os.environ["RETR_INT8_DOT"] = "1"  # then time every graph named, int8 included

    ds = load_dataset(args.dataset, "test", download=False)
    texts = [d.text for d in ds.corpus.docs[:args.docs]]
    names = args.backends.split(",")
    encoders = {b: BiEncoder(EncoderConfig(backend=b, calibration_min_docs=1)) for b in names}
    for enc in encoders.values():
        enc.encode_corpus(texts[:32])  # exported, calibrated, compiled and warm before any timing
    seconds: dict[str, list[float]] = {b: [] for b in names}
    graphs: dict[str, dict] = {}
    for _ in range(args.rounds):
        for b, enc in encoders.items():
            t0 = time.perf_counter()
            graphs[b] = enc.encode_corpus(texts).graph
            seconds[b].append(time.perf_counter() - t0)
    rows = {b: {"seconds": s, "docs_per_s": len(texts) / float(np.median(s)), "graph": graphs[b]}
            for b, s in seconds.items()}
    base = rows[names[0]]["docs_per_s"]
    from common import command_line, write_result

    result = {"command": command_line(), "versions": versions(),
              "platform": platform.platform(), "cpu_count": os.cpu_count(), **cpu, "docs": len(texts),
              "rounds": args.rounds,
              "backends": rows, "ratio_to_first": {b: r["docs_per_s"] / base for b, r in rows.items()}}
    print(f"{len(texts)} {ds.name} documents, median of {args.rounds} alternating passes; this CPU: "
          f"bf16 {'native' if result['bf16'] else 'absent'}, int8 dot products "
          f"{'present' if result['int8_dot'] else 'absent'}, static int8 a candidate for retr: "
          f"{'yes' if result['int8_dot'] else 'no (pruned)'}")
    for b, r in rows.items():
        print(f"{b:>18}: {r['docs_per_s']:6.1f} docs/s ({result['ratio_to_first'][b]:.2f}x {names[0]})")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
