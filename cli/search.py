"""`retr search`: query an index folder."""

from __future__ import annotations

import argparse

from retr.cli import options
from retr.retrieval.request import DEFAULT_K, DEFAULT_MODE


def _condition(text: str) -> tuple[str, str]:
    field, eq, value = text.partition("=")
    if not eq or not field.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: a filter is FIELD=VALUE")
    return field.strip(), value


def add_parser(sub) -> None:
    p = sub.add_parser("search", help="query an index folder: one query, or every topic of a file into a run file")
    p.add_argument("index", help="index folder written by `retr index`")
    p.add_argument("query", nargs="?", default=None, help="the query text (or --topics FILE: a batch)")
    p.add_argument("-k", type=options.positive_int, default=DEFAULT_K, help="hits to return")
    p.add_argument("--mode", default=DEFAULT_MODE, metavar="PIPELINE",
                   help="one pipeline: bm25, dense, hybrid (= fuse(bm25,dense)), or an expression such as bm25+rm3, "
                        "fuse(bm25,bm25+rm3,dense) or hybrid+rerank (docs/guides/search.md), as in the API and the "
                        "service; --rerank adds +rerank to one without it")
    options.add_fusion_arg(p)
    p.add_argument("--rerank", default=None, metavar="MODEL_DIR",
                   help="cross-encoder folder: rescore the first stage's top --rerank-depth hits (default: none)")
    options.add_rerank_args(p)
    p.add_argument("--model", default=None, help="query encoder (default: the one that built the index)")
    options.add_backend_arg(p)
    options.add_query_backend_arg(p)
    options.add_query_prompt_arg(p)
    p.add_argument("--filter", action="append", default=[], metavar="FIELD=VALUE", type=_condition,
                   help="only documents whose record has FIELD equal to VALUE (repeat: all must hold; default: "
                        "every document)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    from retr.cli.batch import add_batch_args

    add_batch_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json

    from retr.indexes.searcher import Searcher
    from retr.retrieval.request import SearchRequest

    if args.topics is not None or args.query is None:
        from retr.cli.batch import run_batch

        return run_batch(args)
    request = SearchRequest.one(args.query, k=args.k, mode=args.mode, rerank=args.rerank,
                                filter=dict(args.filter) or None)  # checked before the index is opened
    searcher = Searcher(args.index, options.query_encoder_config(args),
                        options.pipeline_config(args), options.rerank_config(args, args.rerank))
    try:
        result = searcher.run(request)[0]
    finally:
        searcher.close()
    if args.json:
        out = result.to_dict()
        out["latency_ms"].pop("total")
        print(json.dumps(out, ensure_ascii=False))
        return 0
    if not result.hits:
        print("no results")
    for h in result.hits:
        snippet = " ".join(h.text.split())
        snippet = snippet[:160] + ("…" if len(snippet) > 160 else "")
        title = f"  {h.title}" if h.title else ""
        print(f"{h.rank:>3}  {h.id}  {h.score:.4f}{title}\n     {snippet}")
    return 0
