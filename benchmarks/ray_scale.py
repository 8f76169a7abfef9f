"""Encoding on Ray against encoding in-process, on this machine: 1 and 2 actors, docs/s per core, Ray's cost per
block, and whether the vectors equal a local build's.

Starts a Ray on this machine (``ray.init``), encodes the first ``--docs`` SciFact documents with the default
encoder (all-MiniLM-L6-v2, openvino-int8: a graph calibrated once on the corpus, as `retr index` does) locally
(one process, its default threads) and then with each actor count (one CPU each), and writes
benchmarks/results/ray-scale.json with the arithmetic for 100M documents.

    python benchmarks/ray_scale.py --docs 2000 --actors 1,2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--actors", default="1,2")
    p.add_argument("--batches-per-task", type=int, default=4)
    p.add_argument("--out", default="benchmarks/results/ray-scale.json")
    args = p.parse_args(argv)

    import ray

    from retr.eval.data import load_dataset
    from retr.indexes.ray_encode import encode_on_ray
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ds = load_dataset(args.dataset, "test", download=False)
    texts = [d.full_text() for d in ds.corpus.docs[: args.docs]]
    encoder = BiEncoder(EncoderConfig())
    encoder.encode_corpus(texts[:1100])  # warm-up: the calibrated graph exists (cached) and is compiled
    t0 = time.perf_counter()
    local = encoder.encode_corpus(texts)
    local_s = time.perf_counter() - t0
    results = {"dataset": ds.name, "docs": len(texts), "model": encoder.model_id, "graph": local.graph,
               "cores": os.cpu_count(), "local": {"seconds": local_s, "docs_per_second": len(texts) / local_s,
                                                   "threads": encoder.graph.runner.parallel}, "ray": []}
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)
    results["ray_init_seconds"] = time.perf_counter() - t0
    try:
        for a in (int(x) for x in args.actors.split(",")):
            t0 = time.perf_counter()
            enc = encode_on_ray(encoder, texts, actors=a, cpus_per_actor=1, batches_per_task=args.batches_per_task)
            wall = time.perf_counter() - t0
            ex = enc.executor
            diff = float(np.abs(enc.embeddings - local.embeddings).max())
            steady = wall - ex["first_block_seconds"]
            results["ray"].append({
                "actors": a, "seconds": wall, "docs_per_second": len(texts) / wall,
                "first_block_seconds": ex["first_block_seconds"], "blocks": ex["blocks"], "batches": ex["batches"],
                "actor_busy_seconds": ex["actor_busy_seconds"],
                "docs_per_core_second": len(texts) / ex["actor_busy_seconds"],
                # what the actors spent outside encoding, per block, once they were up
                "overhead_per_block_seconds": max(0.0, a * steady - ex["actor_busy_seconds"]) / ex["blocks"],
                "identical_to_local": bool(np.array_equal(enc.embeddings, local.embeddings)),
                "max_abs_diff_to_local": diff})
    finally:
        ray.shutdown()

    r = {x["actors"]: x for x in results["ray"]}
    per_core = float(np.median([x["docs_per_core_second"] for x in results["ray"]]))
    per_block = float(np.median([x["overhead_per_block_seconds"] for x in results["ray"]]))
    docs_per_block = len(texts) / results["ray"][0]["blocks"]
    target = 100_000_000
    plan = []
    for nodes, cores in ((1, 16), (10, 16), (100, 16)):
        c = nodes * cores
        hours = (target / per_core + target / docs_per_block * per_block) / c / 3600
        plan.append({"nodes": nodes, "cores_per_node": cores, "hours": hours})
    results["projection_100M"] = {"docs_per_core_second": per_core, "overhead_per_block_seconds": per_block,
                                  "docs_per_block": docs_per_block, "plan": plan}
    print(f"{len(texts)} {ds.name} documents, {encoder.model_id}, {local.graph['backend']}, {os.cpu_count()} cores")
    print(f"local ({results['local']['threads']} threads): {local_s:.1f} s, {len(texts) / local_s:.1f} docs/s")
    for a, x in r.items():
        print(f"ray, {a} actor(s): {x['seconds']:.1f} s, {x['docs_per_second']:.1f} docs/s (first block after "
              f"{x['first_block_seconds']:.1f} s), {x['docs_per_core_second']:.1f} docs per core-second, "
              f"overhead {x['overhead_per_block_seconds'] * 1000:.0f} ms per block of {docs_per_block:.0f} docs; "
              f"identical to local: {x['identical_to_local']} (max diff {x['max_abs_diff_to_local']:.2e})")
    if 1 in r and 2 in r:
        results["speedup_2_vs_1"] = r[1]["seconds"] / r[2]["seconds"]
        print(f"2 actors vs 1: {results['speedup_2_vs_1']:.2f}x")
    for row in plan:
        print(f"100M documents on {row['nodes']} x {row['cores_per_node']} cores: {row['hours']:.1f} h")
    from common import write_result

    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
