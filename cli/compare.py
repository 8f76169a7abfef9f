"""`retr compare`: paired significance of metric differences (and latency) between eval reports or TREC runs."""

from __future__ import annotations

import argparse

from retr.cli import options


def add_parser(sub) -> None:
    from retr.eval.compare import DEFAULT_METRICS
    from retr.eval.stats import RESAMPLES

    p = sub.add_parser("compare", help="is B better than A: paired t and randomization tests (Holm-corrected), "
                                       "wins/ties/losses, latency differences with bootstrap intervals")
    p.add_argument("files", nargs="+", help="eval reports (JSON from `retr eval --out`) or TREC run files. One "
                                            "report: its pipelines against its first, per dataset. Several: a "
                                            "later file's pipelines against the first file's of the same name, on "
                                            "the datasets both hold")
    p.add_argument("--qrels", default=None, help="qrels (BEIR TSV or TREC) to score TREC run files against "
                                                    "(default: none; eval reports hold their own scores)")
    p.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="comma-separated, e.g. NDCG@10,MAP@100")
    p.add_argument("--resamples", type=options.positive_int, default=RESAMPLES,
                   help="randomization and bootstrap resamples (exact enumeration when 2^n is not more)")
    p.add_argument("--seed", type=int, default=0, help="seed of the randomization and bootstrap resamples")
    p.add_argument("--alpha", type=float, default=0.05, help="level at which a corrected difference is marked")
    p.add_argument("--out", default=None, help="JSON with every comparison (default: none written)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.eval.compare import compare, comparison_table, metric_cutoffs, systems_from, write_comparison
    from retr.eval.data import load_qrels

    options.check_out(args.out, input=args.files, qrels=args.qrels)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    qrels = load_qrels(args.qrels) if args.qrels else None
    # run files are scored at the default cut-offs and at those the metrics name (NDCG@20 on runs of 100 hits)
    systems = systems_from(args.files, qrels, Path(args.qrels).stem if args.qrels else "qrels",
                           metric_cutoffs(metrics))
    result = compare(systems, metrics, args.resamples, args.seed)
    print(comparison_table(result, args.alpha))
    if args.out:
        write_comparison(result, Path(args.out))
        print(f"\ncomparison written to {args.out}")
    return 0
