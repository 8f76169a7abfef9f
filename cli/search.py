"""`retr search`: query an index folder."""

from __future__ import annotations

import argparse

from retr.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser("search", help="query an index folder: one query, or every topic of a file into a run file")
    p.add_argument("index", help="index folder written by `retr index`")
    p.add_argument("query", nargs="?", default=None, help="the query text (or --topics FILE: a batch)")
    options.add_search_options(p, "search")
    options.add_rerank_args(p)
    p.add_argument("--model", default=None, help="query encoder (default: the one that built the index)")
    options.add_backend_arg(p)
    options.add_query_backend_arg(p)
    options.add_query_prompt_arg(p)
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
    request = SearchRequest.one(args.query, **options.request_options(args))  # checked before the index is opened
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
