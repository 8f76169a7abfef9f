"""`retr report`: one self-contained HTML page (tables and embedded figures) from eval reports."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="an HTML page from eval reports: summary, quality vs latency (Pareto front), "
                                      "Recall@k curves, per-query differences")
    p.add_argument("reports", nargs="+", help="eval reports or suites (JSON from `retr eval --out`)")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.add_argument("--pair", nargs=2, metavar=("A", "B"), default=None,
                   help="the two pipelines whose per-query differences (B - A) are plotted (default: the default "
                        "pipeline, hybrid, against each other one; the first two where there is no hybrid)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from retr.retrieval.errors import RetrError

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RetrError("retr report needs matplotlib: pip install 'retr[report]'") from None
    from retr.cli import options
    from retr.eval.visual import write_report

    options.check_out(args.out, report=args.reports)

    figures = write_report(args.reports, args.out, tuple(args.pair) if args.pair else None)
    print(f"report written to {args.out} ({figures} figures embedded)")
    return 0
