"""`retr search IDX --topics FILE --out RUN`: every topic of a file searched, one run file written.

Topics are read as TSV, JSONL, BEIR queries.jsonl or TREC topics (``retr.eval.topics``); the run is written as
TREC, MS MARCO TSV or JSONL (``retr.eval.trec``). The search is ``Searcher.search_run``, the path of a single
search, the API's batch and the service's batch alike.
"""

from __future__ import annotations

import argparse


def add_batch_args(p: argparse.ArgumentParser) -> None:
    from retr.eval.topics import TREC_FIELDS
    from retr.eval.trec import DEFAULT_TAG, RUN_FORMATS
    from retr.indexes.searcher import BATCH

    p.add_argument("--topics", default=None, metavar="FILE",
                   help="search every topic of FILE (TSV 'id<TAB>query', JSONL, BEIR queries.jsonl or TREC <top> "
                        "topics) instead of one query, and write the run to --out (default: the one query given)")
    p.add_argument("--topic-field", choices=TREC_FIELDS, default="title", help="TREC topics: the field searched")
    p.add_argument("--out", dest="output", default=None, metavar="RUN",
                   help="with --topics: the run file to write (no default: --topics needs it)")
    p.add_argument("--format", choices=RUN_FORMATS, default=RUN_FORMATS[0],
                   help="with --topics: the run file's form (trec: 'qid Q0 docid rank score tag'; msmarco: "
                        "'qid<TAB>docid<TAB>rank'; jsonl: one object per query)")
    p.add_argument("--run-tag", default=DEFAULT_TAG, help="with --topics: the run's tag (TREC's last column)")
    p.add_argument("--query-batch", type=_positive, default=BATCH,
                   help="with --topics: queries encoded and searched together")


def _positive(text: str) -> int:
    from retr.cli.options import positive_int

    return positive_int(text)


def run_batch(args: argparse.Namespace) -> int:
    import time
    from dataclasses import replace

    from retr.cli import options
    from retr.eval.topics import read_topics
    from retr.eval.trec import check_ids, check_tag, write_run
    from retr.indexes.searcher import Searcher
    from retr.retrieval.errors import RetrError
    from retr.retrieval.progress import Progress
    from retr.retrieval.request import SearchRequest

    if args.topics is None:
        raise RetrError("give a query, or --topics FILE to search a batch of them")
    if args.query is not None:
        raise RetrError(f"give a query or --topics, not both (query {args.query!r})")
    if not args.output:
        raise RetrError("--topics needs --out RUN: the run file to write")
    if args.json:
        raise RetrError("--json prints one query's hits: with --topics, write --format jsonl to --out")
    check_tag(args.run_tag, args.format)
    options.check_out(args.output, {"index": args.index}, topics=args.topics)
    topics = read_topics(args.topics, field=args.topic_field)
    check_ids(topics, args.format, args.topics)  # before the search, not after it
    request = SearchRequest.batch(list(topics.values()), **options.request_options(args))
    searcher = Searcher(args.index, options.query_encoder_config(args), options.pipeline_config(args),
                        options.rerank_config(args, args.rerank))
    try:
        if args.rerank:  # the cross-encoder told how many queries it will rerank: its int8 graph made where it pays
            searcher.reranker(args.rerank).expect(len(topics))
        searcher.search_run(replace(request, queries=request.queries[:1], k=1))  # everything loaded before the clock
        with Progress(len(topics), f"searching ({request.pipeline})", unit="q") as bar:
            t0 = time.perf_counter()
            run = searcher.search_run(request, ids=list(topics), chunk=args.query_batch, progress=bar.update)
            wall = time.perf_counter() - t0
    finally:
        searcher.close()
    write_run(run, args.output, args.format, args.run_tag)
    print(f"searched {len(topics)} topics ({request.pipeline}, k={request.k}) in {wall:.2f} s: "
          f"{len(topics) / wall:.1f} queries/s; {sum(map(len, run.values()))} hits written to {args.output} "
          f"({args.format})")
    return 0
