"""`retr regress`: measure the expected scores of a TOML file again; fail on any drift."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("regress", help="measure expected scores again (benchmarks/expected/*.toml); exit 1 on drift")
    p.add_argument("file", help="TOML file of [[expect]] entries")
    p.add_argument("--tier", choices=("ci", "all"), default="all", help="ci: only the entries marked cheap")
    p.add_argument("--datasets", default=None,
                   help="folder holding the datasets the entries name (default: a path as written, else a name "
                        "under $RETR_DATA)")
    p.add_argument("--models", default=None,
                   help="folder holding the trained models the entries name (options model and reranker; default: "
                        "each name as written, a path or a hub id)")
    p.add_argument("--markdown", action="store_true", help="print the expected figures as a Markdown table, measure "
                                                           "nothing")
    p.add_argument("--no-download", action="store_true", help="never download a dataset")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.eval.regress import (
        for_this_cpu,
        for_this_export,
        load_expected,
        markdown_table,
        measure,
        outcome_table,
    )
    from retr.retrieval.backends.graphs import EXPORT_GENERATION
    from retr.retrieval.backends.platform import this_platform

    entries = load_expected(args.file)
    if args.tier == "ci":
        entries = [e for e in entries if e.tier == "ci"]
    if args.markdown:
        print(markdown_table(entries))
        return 0
    kind = this_platform().kind
    entries, other = for_this_cpu(entries, kind)
    if other:
        print(f"{other} expected score(s) measured on another kind of CPU skipped (this one: {kind})")
    entries, older = for_this_export(entries, EXPORT_GENERATION)
    if older:
        print(f"{older} expected score(s) of this kind of CPU measured with graphs exported another way skipped "
              f"(this retr exports generation {EXPORT_GENERATION}): measure them again")
    if not entries:
        print(f"no expected scores for this kind of CPU ({kind}) in {args.file}: nothing measured")
        return 0
    outcomes = measure(entries, Path(args.datasets) if args.datasets else None, download=not args.no_download,
                       models=Path(args.models) if args.models else None)
    print(outcome_table(outcomes))
    drifted = [o for o in outcomes if not o.ok]
    print(f"\n{len(outcomes) - len(drifted)} of {len(outcomes)} expected scores hold"
          + (f"; {len(drifted)} drifted" if drifted else ""))
    return 1 if drifted else 0
