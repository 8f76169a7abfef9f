"""A lone query through each graph retr could run it on, on this machine: SciFact test queries, one at a time,
each graph's runner alone (tokenised beforehand; no search), in blocks alternating between the graphs so that a
shared machine's drift falls on all of them, and each graph's query ranking noise against the documents' graph
(``QueryGraphs.noise``, the chooser's check). A script, not a test: it decides nothing, it measures what a
chooser could be offered.

    RETR_CACHE=C python benchmarks/query_graph_speed.py [--dataset ../shared/datasets/scifact] [--rounds 8] [--unpadded]
                                                        [--out benchmarks/results/query-graph-speed.json]

``C`` is a cache holding the model's graphs: the documents' base graph and, where they were made, its static int8
graph (a corpus that paid a calibration), the int8-weights graph and onnx-int8 (`retr doctor --export` makes the
last two). Each OpenVINO graph is timed as one stream over every core (as the documents' graph is offered to
queries), the onnx graphs on one thread (as offered) and on every core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np
from common import cpu, table, write_result


def runners(enc) -> dict:
    """name -> (Graph, runner): every graph of the model in the cache that can encode a query here."""
    from retr.retrieval.backends.registry import BACKENDS
    from retr.retrieval.backends.runners import OrtRunner, default_threads

    out = {}
    docs = enc.graph
    out[f"{docs.variant} ({docs.precision}), one stream"] = (docs, docs.runner.one_stream())
    for name, backend in BACKENDS.items():
        if name == docs.variant or not backend.exported:
            continue
        graph = enc.exported.find(backend, enc.planner.calibration if backend.calibrated else None)
        if graph is None:
            continue
        if backend.runtime == "openvino":  # as the chooser offers it (its model read once)
            out[f"{name} ({graph.precision}), one stream"] = (graph, graph.runner.one_stream())
        else:
            out[f"{name} ({graph.precision}), 1 thread"] = (graph, OrtRunner(graph.path, 1, graph.precision))
            out[f"{name} ({graph.precision}), {default_threads()} threads"] = (graph, OrtRunner(
                graph.path, default_threads(), graph.precision))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="../shared/datasets/scifact")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results/query-graph-speed.json")
    ap.add_argument("--unpadded", action="store_true", help="each query at its own length (retr pads it)")
    args = ap.parse_args()

    from retr.eval.data import load_dataset
    from retr.retrieval.backends import batching
    from retr.retrieval.backends.graphs import lone_feed
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.tokens import prefixed

    ds = load_dataset(args.dataset, "test", download=False)
    texts = list(ds.queries.values())[: args.queries]
    enc = BiEncoder(EncoderConfig())
    rows = enc.tokens.ids(prefixed(enc.prompts.query, texts))
    graphs = runners(enc)
    # each query as retr runs it through that graph (``graphs.lone_feed``: padded to a multiple of 8 tokens through
    # an OpenVINO graph), or at its own length (--unpadded)
    feeds_of = {name: [batching.lone_feed(r) if args.unpadded else lone_feed(replace(g, runner=run), r, enc.max_length)
                       for r in rows]
                for name, (g, run) in graphs.items()}
    noise = {name: (None if g is enc.graph else enc.query_graphs.noise(replace(g, runner=r)))
             for name, (g, r) in graphs.items()}
    for name, (_, r) in graphs.items():  # every query length compiled once, before any timing
        for f in feeds_of[name]:
            r(f)
    names = list(graphs)
    rounds: dict[str, list[float]] = {n: [] for n in names}
    for k in range(args.rounds):
        for name in names if k % 2 == 0 else names[::-1]:
            run, feeds = graphs[name][1], feeds_of[name]
            for f in feeds[:20]:  # back in its threads' caches
                run(f)
            times = []
            for f in feeds:
                t0 = time.perf_counter()
                run(f)
                times.append(time.perf_counter() - t0)
            rounds[name].append(statistics.median(times) * 1000)
    res = {"cpu": cpu(), "queries": len(rows), "padded": not args.unpadded, "mean_tokens": float(np.mean([len(r) for r in rows])),
           "documents_graph": enc.graph.info(), "rounds": args.rounds,
           "graphs": {n: {"median_ms": statistics.median(rounds[n]), "round_medians_ms": rounds[n],
                          "rank_noise": noise[n]} for n in names}}
    print(table(f"a lone query's graph alone, {len(rows)} queries of {args.dataset}, median of {args.rounds} "
                "alternating blocks", ["graph", "median ms", "ranking noise"],
                [[n, v["median_ms"], "-" if v["rank_noise"] is None else f"{v['rank_noise']:.4f}"]
                 for n, v in res["graphs"].items()]))
    write_result(args.out, res)


if __name__ == "__main__":
    main()
