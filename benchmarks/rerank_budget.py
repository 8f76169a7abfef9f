"""Choose the reranker's default depth, max length and graph by measured quality per millisecond.

The pipeline a user runs: the trained hybrid's top ``depth``, rescored by a trained cross-encoder, interpolated
with the first stage at the weight stored with the cross-encoder (chosen on dev by `retr train cross-encoder`).
For every (graph, max length) the cross-encoder scores each query's top ``max(depths)`` once; each depth's
ranking uses the scores of its own head. Latency is the rerank stage alone as `retr search` runs it (the
documents' texts, tokenising, the graph, interpolation), one query at a time, warm-up excluded, p50/p95 over
``--timed`` queries, each depth timed on its own.

Queries: the dev split carved from train exactly as the trainers carve it (``--split dev``, the default; choose
on these), or the test queries (``--split test``; report, never tune). ``--curve`` adds each row's nDCG@10 at
every interpolation weight 0, 0.1 .. 1 (the same cross-encoder scores); ``--timed 0`` measures quality only.
Another collection's test queries (``--dataset ../shared/datasets/npl --split test``) show what the reranker does
on text it never saw.

    python benchmarks/rerank_budget.py --model BI --reranker CE [--split dev|test] [--depths 10,20,30,50]
        [--lengths 128,192,256] [--inputs head,focused] [--backends openvino,openvino-int8] --out benchmarks/results/rerank-budget.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _pct(seconds: list[float]) -> dict:
    """p50 and p95 in ms of ``seconds``, by eval's latency percentiles (None for each without a sample)."""
    from common import percentiles

    pc = percentiles(seconds, scale=1000.0)
    return {"p50_ms": pc["p50"], "p95_ms": pc["p95"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--model", required=True, help="the first stage's bi-encoder (trained)")
    p.add_argument("--reranker", required=True, help="the cross-encoder folder (trained)")
    p.add_argument("--split", default="dev", choices=("dev", "test"))
    p.add_argument("--depths", default="10,20,30,50")
    p.add_argument("--lengths", default="128,192,256")
    p.add_argument("--backends", default="openvino,openvino-int8")
    p.add_argument("--timed", type=int, default=40, help="queries timed per setting (0: quality only)")
    p.add_argument("--inputs", default="",
                   help="what the cross-encoder reads of a document, e.g. head,focused (default: its own form)")
    p.add_argument("--curve", action="store_true", help="nDCG@10 at every interpolation weight 0, 0.1 .. 1")
    p.add_argument("--out", default="benchmarks/results/rerank-budget.json")
    args = p.parse_args(argv)
    from common import command_line, write_result

    from retr.eval.data import load_dataset
    from retr.eval.metrics import evaluate
    from retr.indexes.build import IndexConfig, cached_index
    from retr.indexes.searcher import Searcher
    from retr.retrieval.artifacts import versions
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig, rerank_head
    from retr.retrieval.types import Hit, Qrels, Run
    from retr.train.data import split_dev

    depths = sorted(int(x) for x in args.depths.split(","))
    lengths = [int(x) for x in args.lengths.split(",")]
    ds = load_dataset(args.dataset, "train" if args.split == "dev" else "test", download=False)
    if args.split == "dev":
        qids = split_dev(ds.qrels, 0.1, 42)[1]  # the trainers' defaults (dev_fraction, seed)
    else:
        qids = [q for q in ds.queries if ds.qrels.num_relevant(q) > 0]
    qrels = Qrels({q: ds.qrels[q] for q in qids})
    enc_cfg = EncoderConfig(model=args.model)
    cfg = IndexConfig(encoder=enc_cfg, bm25=BM25Config())
    encoder = BiEncoder(enc_cfg)  # the first stage as `retr eval` builds it on this CPU
    folder = cached_index(ds.name, ds.corpus, encoder, cfg).folder
    first_documents = encoder.planner.corpus_backend  # read before int8 is forced below
    searcher = Searcher(folder, enc_cfg)
    fetch = max(10, *depths)  # at least the 10 hits nDCG@10 reads, under every depth's reranked head
    first = {q: r for q, r in zip(qids, searcher.search_many([ds.queries[q] for q in qids], fetch, "hybrid"),
                                  strict=True)}
    searcher.close()
    # then each reranker graph named is measured as named, int8 included on a CPU without int8 dot products (where
    # retr itself would score with the base graph): the figures then say what int8 costs there
    os.environ.setdefault("RETR_INT8_DOT", "1")
    full = {d.doc_id: d.full_text() for d in ds.corpus.docs}  # what the reranker reads of a document
    texts = {q: [full[h.id] for h in first[q].hits] for q in qids}
    hits = {q: [Hit(h.id, h.score) for h in first[q].hits] for q in qids}

    def ndcg(run: dict) -> float:
        return evaluate(Run(run), qrels, [10]).mean["NDCG@10"]

    result = {"command": command_line(), "versions": versions(),
              "dataset": ds.name, "split": args.split, "queries": len(qids), "model": args.model,
              "reranker": args.reranker, "first_stage": "hybrid",
              "first_stage_documents": first_documents,
              "first_stage_ndcg@10": ndcg({q: hits[q][:10] for q in qids}),
              "rows": []}
    timed = qids[: args.timed]
    for backend in [b.strip() for b in args.backends.split(",")]:
        for length, inputs in [(n, f) for n in lengths for f in [x.strip() for x in args.inputs.split(",")]]:
            rr = CrossEncoderReranker(RerankConfig(model=args.reranker, max_length=length, backend=backend,
                                                   inputs=inputs or None,
                                                   depth=max(depths)))
            alpha = rr.interpolation
            ce = {q: rr.score(ds.queries[q], texts[q][: max(depths)]) for q in qids}
            for q in timed[:3]:  # warm-up, untimed
                rr.score(ds.queries[q], texts[q][: min(depths)])
            for depth in depths:
                def reranked(weight: float, depth: int = depth, ce: dict = ce) -> dict:
                    return {q: rerank_head(hits[q][:depth], hits[q][depth:], ce[q][:depth], weight) for q in qids}

                run = reranked(alpha)
                seconds = []
                for q in timed:
                    t0 = time.perf_counter()
                    rerank_head(hits[q][:depth], hits[q][depth:], rr.score(ds.queries[q], texts[q][:depth]), alpha)
                    seconds.append(time.perf_counter() - t0)
                row = {"backend": backend, "precision": rr.describe()["precision"], "max_length": length,
                       "inputs": rr.inputs,
                       "depth": depth, "interpolation": alpha, "ndcg@10": ndcg(run),
                       **_pct(seconds)}
                row["gain"] = row["ndcg@10"] - result["first_stage_ndcg@10"]
                if args.curve:
                    row["ndcg@10_by_interpolation"] = {f"{w / 10:.1f}": ndcg(reranked(w / 10)) for w in range(11)}
                result["rows"].append(row)
                write_result(args.out, result, say=False)  # row by row: a later setting's failure keeps the ones measured
                timing = f" p50 {row['p50_ms']:7.1f} ms p95 {row['p95_ms']:7.1f} ms" if seconds else ""
                print(f"{backend:>10} {row['precision']:>10} len {length:>4} {rr.inputs:>7} depth {depth:>3}: nDCG@10 "
                      f"{row['ndcg@10']:.4f} ({row['gain']:+.4f}){timing}", flush=True)
                if args.curve:
                    print("  by weight: " + " ".join(f"{w} {v:.4f}" for w, v in
                                                     row["ndcg@10_by_interpolation"].items()), flush=True)
            del rr
    print(f"{ds.name} {args.split}, {len(qids)} queries; first stage (hybrid) nDCG@10 "
          f"{result['first_stage_ndcg@10']:.4f}")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
