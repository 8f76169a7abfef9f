"""`retr search`: query an index folder."""

from __future__ import annotations

import argparse

from retr.cli import options
from retr.retrieval.pipeline import FIRST_STAGES


def add_parser(sub) -> None:
    p = sub.add_parser("search", help="query an index folder")
    p.add_argument("index", help="index folder written by `retr index`")
    p.add_argument("query")
    p.add_argument("-k", type=options.positive_int, default=10)
    p.add_argument("--mode", choices=FIRST_STAGES, default="dense")
    options.add_fusion_arg(p)
    p.add_argument("--rerank", default=None, metavar="MODEL_DIR", help="cross-encoder folder")
    options.add_rerank_args(p)
    p.add_argument("--model", default=None, help="query encoder (default: the one that built the index)")
    options.add_backend_arg(p)
    options.add_query_backend_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json

    from retr.indexes.folder import IndexFolder
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.pipeline import PipelineConfig, PipelineFactory, PipelineSpec, encoder_for_index
    from retr.retrieval.protocol import StageTimer
    from retr.retrieval.rerank import CrossEncoderReranker
    from retr.retrieval.types import check_query

    query = check_query(args.query)
    spec = PipelineSpec(args.mode, rerank=bool(args.rerank))
    index = IndexFolder(args.index)
    encoder = (encoder_for_index(index, EncoderConfig(model=args.model, backend=args.backend,
                                                      query_backend=args.query_backend))
               if spec.uses_dense else None)
    reranker = CrossEncoderReranker(options.rerank_config(args, args.rerank)) if args.rerank else None
    factory = PipelineFactory(index, encoder, reranker, PipelineConfig(fusion=args.fusion))
    retriever = factory.make(spec)
    timer = StageTimer()
    hits = retriever.search({"q": query}, args.k, timer)["q"]
    positions = {d: i for i, d in enumerate(index.ids)}
    results = []
    for rank, h in enumerate(hits, start=1):
        doc = index.docstore.get(positions[h.doc_id])
        results.append({"rank": rank, "id": h.doc_id, "score": h.score, "title": doc.title, "text": doc.text})
    index.close()
    if args.json:
        print(json.dumps({"query": query, "pipeline": spec.name, "k": args.k, "results": results,
                          "latency_ms": {s: v * 1000 for s, v in timer.seconds.items()}}, ensure_ascii=False))
        return 0
    if not results:
        print("no results")
    for r in results:
        snippet = " ".join(r["text"].split())
        snippet = snippet[:160] + ("…" if len(snippet) > 160 else "")
        title = f"  {r['title']}" if r["title"] else ""
        print(f"{r['rank']:>3}  {r['id']}  {r['score']:.4f}{title}\n     {snippet}")
    return 0
