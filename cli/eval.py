"""`retr eval`: BEIR metrics and latency for pipelines on a dataset."""

from __future__ import annotations

import argparse

from retr.cli import options
from retr.eval.runner import DEFAULT_PIPELINES, EvalConfig


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="BEIR metrics and latency for pipelines on a dataset, or metrics of run files")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset",
                        help="BEIR folder, or a name under $RETR_DATA (downloaded if online); several, "
                             "comma-separated, or a text file listing one per line: one report holding each, and a "
                             "summary table")
    source.add_argument("--run", action="append", dest="runs", default=None, metavar="RUN",
                        help="score a run file made elsewhere (TREC, MS MARCO TSV or JSONL; repeat for several) "
                             "against --qrels, with the scorer of --dataset and `retr compare`")
    source.add_argument("--index", default=None, metavar="IDX",
                        help="evaluate an index folder as it is (built by `retr index`, changed, sharded, of "
                             "passages, lean): search --topics with it and score against --qrels; nothing rebuilt")
    p.add_argument("--qrels", default=None,
                   help="with --run or --index: the judgements (BEIR TSV or TREC qrels) to score against (no "
                        "default: both need it)")
    p.add_argument("--topics", default=None, metavar="FILE",
                   help="with --index: the queries (TSV 'id<TAB>query', JSONL, BEIR queries.jsonl or TREC topics); "
                        "the judged ones are searched (no default: --index needs it)")
    from retr.eval.topics import TREC_FIELDS

    p.add_argument("--topic-field", choices=TREC_FIELDS, default=TREC_FIELDS[0],
                   help="TREC topics: the field searched")
    p.add_argument("--split", default="test", help="the split whose queries and qrels are scored")
    p.add_argument("--modes", dest="pipelines", default=",".join(DEFAULT_PIPELINES),
                   metavar="PIPELINE[,PIPELINE...]",
                   help="the pipelines to measure, comma-separated (a comma inside parentheses belongs to its "
                        "expression), each on the same index: bm25, dense, hybrid, dense+rerank, hybrid+rerank, "
                        "bm25+rerank, bm25+rm3, fuse(bm25,bm25+rm3,dense), ... (docs/guides/search.md)")
    options.add_search_options(p, "eval")
    options.add_rerank_args(p)
    options.add_k_values_arg(p)
    p.add_argument("--ignore-identical-ids", action="store_true",
                   help="drop hits whose doc id equals the query id (BEIR's ArguAna/Quora setting)")
    p.add_argument("--warmup", type=int, default=EvalConfig.warmup, help="untimed queries before measuring")
    p.add_argument("--out", default=None, help="JSON report path (default: none written)")
    p.add_argument("--run-dir", default=None,
                   help="folder for one TREC run file per pipeline (default with --out: REPORT-runs/ beside it)")
    p.add_argument("--no-download", action="store_true", help="never download a dataset")
    options.add_model_args(p)
    options.add_query_backend_arg(p)
    options.add_index_args(p)
    options.add_bm25_args(p)
    options.add_passage_args(p)
    options.add_sparse_model_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.eval.data import load_dataset
    from retr.eval.report import EvalSuite
    from retr.eval.runner import EvalConfig, run_eval
    from retr.eval.table import detail_table, main_table, summary_table
    from retr.retrieval.errors import RetrError
    from retr.retrieval.pipeline import parse_pipelines

    if args.runs is not None:
        return _score_runs(args)
    if args.qrels is not None and args.index is None:
        raise RetrError("--qrels goes with --run or --index (a --dataset folder holds its own qrels/)")
    if args.topics is not None and args.index is None:
        raise RetrError("--topics goes with --index (a --dataset folder holds its own queries)")
    cfg = EvalConfig(
        pipelines=parse_pipelines(args.pipelines), k_values=args.k_values,
        encoder=options.encoder_config(args, query_backend=True), dense=options.dense_config(args),
        bm25=options.bm25_config(args), pipeline=options.pipeline_config(args),
        reranker=options.rerank_config(args, args.rerank), ignore_identical_ids=args.ignore_identical_ids,
        warmup=max(0, args.warmup), use_cache=not args.no_cache, passages=options.passage_config(args),
        shards=args.shards, executor=options.executor_config(args), sparse=options.sparse_config(args),
    )
    if args.index is not None:
        return _eval_index(args, cfg)
    specs = dataset_specs(args.dataset)
    datasets = [load_dataset(s, args.split, download=not args.no_download) for s in specs]  # all checked first
    options.check_out(args.out, {"dataset": [str(d.path) for d in datasets]})
    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is None and args.out:
        out = Path(args.out)
        run_dir = out.with_name(f"{out.stem}-runs")
    options.check_run_dir(run_dir)
    reports = []
    for dataset in datasets:
        sub = run_dir / dataset.name if run_dir is not None and len(datasets) > 1 else run_dir
        report = run_eval(dataset, cfg, sub)
        reports.append(report)
        print(main_table(report))
        print()
        print(detail_table(report))
        print()
    if len(reports) > 1:
        print(summary_table(reports))
    if args.out:
        (reports[0] if len(reports) == 1 else EvalSuite(reports)).write(Path(args.out))
        print(f"\nreport written to {args.out}")
    return 0


def dataset_specs(value: str) -> list[str]:
    """``a,b,c`` or a text file listing one dataset per line (blank lines and ``#`` comments skipped)."""
    from pathlib import Path

    from retr.retrieval.errors import RetrError

    path = Path(value)
    if path.is_file() and path.suffix in (".txt", ".list", ""):
        specs = [line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
        specs = [s for s in specs if s]
        if not specs:
            raise RetrError(f"{path}: lists no dataset")
        return specs
    specs = [s.strip() for s in value.split(",") if s.strip()]
    dup = next((s for s in specs if specs.count(s) > 1), None)
    if dup:
        raise RetrError(f"--dataset names {dup!r} twice")
    return specs


def _score_runs(args: argparse.Namespace) -> int:
    """``--run RUN --qrels FILE``: the report of runs made elsewhere (metrics and per-query values; no latency)."""
    from pathlib import Path

    from retr.eval.runner import score_runs
    from retr.retrieval.errors import RetrError

    if not args.qrels:
        raise RetrError("--run needs --qrels: the judgements to score the run against")
    runs: dict[str, str] = {}
    for path in args.runs:
        name = Path(path).stem
        if name in runs:
            raise RetrError(f"two runs are both named {name!r} ({runs[name]}, {path}): give the files different names")
        runs[name] = path
    options.check_out(args.out, run=args.runs, qrels=args.qrels)
    report = score_runs(runs, args.qrels, args.k_values, args.ignore_identical_ids)
    return _show(report, args.out)


def _eval_index(args: argparse.Namespace, cfg) -> int:
    """``--index IDX --topics FILE --qrels FILE``: the report of ``--dataset`` for an index as it is."""
    from pathlib import Path

    from retr.eval.data import load_qrels
    from retr.eval.runner import run_eval_index
    from retr.eval.topics import read_topics
    from retr.retrieval.errors import RetrError

    if not args.topics or not args.qrels:
        raise RetrError("--index needs --topics FILE (the queries) and --qrels FILE (their judgements)")
    options.check_out(args.out, {"index": args.index}, topics=args.topics, qrels=args.qrels)
    topics = read_topics(args.topics, field=args.topic_field)
    qrels = load_qrels(args.qrels)
    run_dir = Path(args.run_dir) if args.run_dir else (Path(args.out).with_name(f"{Path(args.out).stem}-runs")
                                                       if args.out else None)
    options.check_run_dir(run_dir)
    report = run_eval_index(args.index, topics, qrels, cfg, run_dir, args.qrels)
    return _show(report, args.out)


def _show(report, out: str | None) -> int:
    """One report's tables on stdout, and the report written to ``out`` when given (``--run`` and ``--index``)."""
    from pathlib import Path

    from retr.eval.table import detail_table, main_table

    print(main_table(report))
    print()
    print(detail_table(report))
    if out:
        report.write(Path(out))
        print(f"\nreport written to {out}")
    return 0
