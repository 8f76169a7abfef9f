"""`retr add`, `retr delete`, `retr compact`: change an index folder without rebuilding it."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("add", help="add (or update) documents in an index without rebuilding it")
    p.add_argument("index", help="index folder (from `retr index`)")
    p.add_argument("--corpus", required=True, help="the documents to add: BEIR folder or corpus file "
                                                   "(.jsonl, .csv, .tsv); an id already in the index is an update")
    p.add_argument("--id-field", default=None,
                   help="the field holding a document's id (default: the index's own, else detected: _id, id, "
                        "docid, doc_id)")
    p.add_argument("--text-field", default=None,
                   help="the field holding a document's text (default: the index's own, else detected: text, "
                        "contents, body, abstract)")
    p.add_argument("--title-field", default=None,
                   help="the field holding a document's title (default: the index's own, else 'title' where "
                        "present; '' for none)")
    p.set_defaults(run=run_add)

    p = sub.add_parser("delete", help="delete documents from an index (tombstones; `retr compact` folds them away)")
    p.add_argument("index", help="index folder (from `retr index`)")
    p.add_argument("--ids", required=True, help="file of document ids, one per line")
    p.add_argument("--missing-ok", action="store_true", help="skip ids the index does not hold (default: an error)")
    p.set_defaults(run=run_delete)

    p = sub.add_parser("compact", help="rewrite an index's doc store without its deleted records")
    p.add_argument("index", help="index folder (from `retr index`)")
    p.set_defaults(run=run_compact)


def _report(what: str, folder: str, change) -> int:
    print(f"{what} {folder}: generation {change.generation}, {change.live} live documents, "
          f"{change.tombstones} tombstones ({change.seconds:.2f} s)")
    return 0


def run_add(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.indexes.corpus import CorpusFormat, load_corpus
    from retr.indexes.update import add_documents, recorded_format

    # the fields the index was built with, where not given: documents added are read as its own were
    fmt = recorded_format(args.index, CorpusFormat(args.id_field, args.text_field, args.title_field))
    corpus = load_corpus(Path(args.corpus), fmt)
    change = add_documents(args.index, corpus)
    return _report(f"added {change.added}, updated {change.updated} in", args.index, change)


def read_ids(path: str) -> dict[str, int]:
    """The ids of an ``--ids`` file, one a line, each with the line it was first read from: blank lines skipped,
    a byte-order mark (as Windows editors save UTF-8) never part of the first id."""
    from pathlib import Path

    from retr.retrieval.artifacts import read_text

    out: dict[str, int] = {}
    for lineno, line in enumerate(read_text(Path(path)).removeprefix("\ufeff").splitlines(), start=1):
        if line.strip():
            out.setdefault(line.strip(), lineno)
    return out


def run_delete(args: argparse.Namespace) -> int:
    from retr.indexes.update import delete_documents

    change = delete_documents(args.index, read_ids(args.ids), source=args.ids, missing_ok=args.missing_ok)
    return _report(f"deleted {change.deleted} from", args.index, change)


def run_compact(args: argparse.Namespace) -> int:
    from retr.indexes.update import compact_index

    change = compact_index(args.index)
    return _report("compacted", args.index, change)
