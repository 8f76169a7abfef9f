"""Run files: the edge where a ``Run`` meets trec_eval and other tools.

Written as TREC (``qid Q0 docid rank score tag``, the default), MS MARCO TSV (``qid<TAB>docid<TAB>rank``) or JSONL
(one object per query: ``{"qid", "tag", "hits": [{"docid", "rank", "score"}]}``); read back from any of the three
(the form is detected). Scores are written as Python writes them back exactly (repr), so a run read back scores
to the last digit as the run that was written. An MS MARCO run holds no scores: its hits read back scored
``-rank``, which keeps their order.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from retr.eval.forms import file_and_form
from retr.indexes.corpus import jsonl_records, lines
from retr.retrieval.artifacts import atomic_write_lines
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Qrels, Run

RUN_FORMATS = ("trec", "msmarco", "jsonl")
DEFAULT_TAG = "retr"
_SPACE = re.compile(r"\s")
logger = logging.getLogger(__name__)


def _no_space(value: str, what: str, fmt: str) -> str:
    if not value or _SPACE.search(value):
        raise RetrError(f"{what} {value!r} is empty or holds whitespace: a {fmt} run cannot hold it "
                        f"(write --format jsonl)")
    return value


def check_tag(tag: str, fmt: str = "trec") -> str:
    """A run tag ``fmt`` can hold (TREC: no whitespace); checked before a batch search, not after it."""
    if fmt not in RUN_FORMATS:
        raise RetrError(f"run format {fmt!r}: choose one of {', '.join(RUN_FORMATS)}")
    return _no_space(tag, "run tag", "TREC") if fmt == "trec" else tag


def check_ids(topics, fmt: str, source: str) -> None:
    """Topic ids a run of ``fmt`` can hold (TREC: no whitespace; MS MARCO: no tab): checked on the topics read
    from ``source``, before their search, not when its run is written."""
    for qid in topics:
        if fmt == "trec" and _SPACE.search(qid):
            raise RetrError(f"{source}: topic id {qid!r} holds whitespace: a TREC run cannot hold it "
                            f"(write --format jsonl)")
        if fmt == "msmarco" and ("\t" in qid or "\n" in qid):
            raise RetrError(f"{source}: topic id {qid!r} holds a tab or newline: an MS MARCO run cannot hold it")


def _trec_lines(run: Run, tag: str) -> Iterator[str]:  # the tag checked by ``write_run``, before the file
    for qid, hits in run.items():
        _no_space(qid, "query id", "TREC")
        for rank, h in enumerate(hits, start=1):
            yield f"{qid} Q0 {_no_space(h.doc_id, 'doc id', 'TREC')} {rank} {h.score!r} {tag}\n"


def _msmarco_lines(run: Run, tag: str) -> Iterator[str]:
    for qid, hits in run.items():
        if "\t" in qid or "\n" in qid:
            raise RetrError(f"query id {qid!r} holds a tab or newline: an MS MARCO run cannot hold it")
        for rank, h in enumerate(hits, start=1):
            if "\t" in h.doc_id or "\n" in h.doc_id:
                raise RetrError(f"doc id {h.doc_id!r} holds a tab or newline: an MS MARCO run cannot hold it")
            yield f"{qid}\t{h.doc_id}\t{rank}\n"


def _jsonl_lines(run: Run, tag: str) -> Iterator[str]:
    return (json.dumps({"qid": qid, "tag": tag,
                        "hits": [{"docid": h.doc_id, "rank": r, "score": h.score} for r, h in enumerate(hits, 1)]},
                       ensure_ascii=False) + "\n" for qid, hits in run.items())


_WRITERS: dict[str, Callable[[Run, str], Iterator[str]]] = {"trec": _trec_lines, "msmarco": _msmarco_lines,
                                                        "jsonl": _jsonl_lines}


def write_run(run: Run, path: str | Path, fmt: str = "trec", tag: str = DEFAULT_TAG) -> None:
    """Write ``run`` to ``path`` as ``fmt`` (one of ``RUN_FORMATS``), atomically: all of it or nothing."""
    if fmt not in _WRITERS:
        raise RetrError(f"run format {fmt!r}: choose one of {', '.join(RUN_FORMATS)}")
    if any(not math.isfinite(h.score) for hits in run.values() for h in hits):
        raise RetrError("the run holds a score that is not a finite number: nothing written")
    check_tag(tag, fmt)
    atomic_write_lines(Path(path), _WRITERS[fmt](run, tag), output=True)  # streamed: never the whole text at once


def write_trec(run: Run, path: str | Path, tag: str = DEFAULT_TAG) -> None:
    """Write ``run`` as a TREC run file, atomically."""
    write_run(run, path, "trec", tag)


def run_format(path: Path) -> str:
    """The form of a run file, from its first non-blank line."""
    for lineno, line in lines(path):
        head = line.strip()
        if not head:
            continue
        if head.startswith("{"):
            return "jsonl"
        if len(head.split()) == 6:
            return "trec"
        if len(line.rstrip("\r\n").split("\t")) == 3:
            return "msmarco"
        raise RetrError(f"{path}:{lineno}: not a run file: expected 'qid Q0 docid rank score tag' (TREC), "
                        f"'qid<TAB>docid<TAB>rank' (MS MARCO) or a JSON object per query")
    raise RetrError(f"{path}: holds no ranking")


def read_run(path: str | Path, fmt: str | None = None) -> Run:
    """A run file in any of ``RUN_FORMATS`` (default: detected). Every malformed line is an error naming it."""
    path, fmt = file_and_form(path, fmt, RUN_FORMATS, run_format, "run")
    rankings: dict[str, dict[str, float]] = {}
    for lineno, qid, doc_id, score in {"trec": _trec_hits, "msmarco": _msmarco_hits, "jsonl": _jsonl_hits}[fmt](path):
        docs = rankings.setdefault(qid, {})
        if doc_id is None:
            continue  # a query with no hits
        if doc_id in docs:
            raise RetrError(f"{path}:{lineno}: query {qid!r} lists document {doc_id!r} twice")
        docs[doc_id] = score
    return Run({q: docs.items() for q, docs in rankings.items()})


def read_trec(path: str | Path) -> Run:
    return read_run(path, "trec")


def with_judged_queries(run: Run, qrels: Qrels, source: str = "run") -> Run:
    """``run`` with an empty ranking for every judged query it lacks (trec_eval's ``-c``): a run file cannot write
    a query that found nothing, and such a query counts 0, as it does when ``retr eval`` runs the queries itself.
    A warning where none of the documents it retrieved for judged queries is judged (``_warn_unjudged``)."""
    missing = [q for q in qrels if q not in run]
    if not missing:
        _warn_unjudged(run, qrels, source)
        return run
    if len(missing) == len(qrels):
        raise RetrError(f"{source}: the run and the qrels share no query id (run: {next(iter(run), 'none')!r}, "
                        f"qrels: {next(iter(qrels), 'none')!r}, ...)")
    unjudged = [q for q in run if q not in qrels]
    if unjudged:  # ids written otherwise (01 against 1) would score 0 here: said where -q still shows it
        logger.warning("%s: %d judged quer(ies) missing from the run count 0 (e.g. %r), and %d of its queries are "
                       "not judged (e.g. %r): are the query ids written the same way?", source, len(missing),
                       missing[0], len(unjudged), unjudged[0])
    else:
        logger.info("%s: %d judged quer(ies) with no hit in the run count 0", source, len(missing))
    _warn_unjudged(run, qrels, source)
    return Run({**run, **{q: () for q in missing}})


def say_depth(run: Run, k_values, source: str) -> int:
    """How deep ``run`` is (the most hits any query has), said in a warning where a cut-off goes past it: Recall@1000
    of a 10-deep run counts only those 10 hits."""
    depth = max((len(hits) for hits in run.values()), default=0)
    past = sorted(k for k in set(k_values) if k > depth)
    if depth and past:
        logger.warning("%s is %d deep (at most %d hit%s per query): %s count%s only those", source, depth, depth,
                       "" if depth == 1 else "s", ", ".join(f"@{k}" for k in past), "s" if len(past) == 1 else "")
    return depth


def _warn_unjudged(run: Run, qrels: Qrels, source: str) -> None:
    """A warning where not one document ``run`` retrieved for a judged query is judged for it: the run's ids are
    then almost always written otherwise than the qrels' (``d17`` against ``17``, another id field), and every
    metric would be a silent 0."""
    retrieved = sum(len(run[q]) for q in qrels if q in run)
    if retrieved and not any(h.doc_id in qrels[q] for q in qrels if q in run for h in run[q]):
        q = next(q for q in qrels if q in run and run[q])
        logger.warning("%s: none of its %d documents retrieved for judged queries is judged (query %r: run %r, "
                       "qrels %r, ...): are the document ids written the same way?", source, retrieved, q,
                       run[q][0].doc_id, next(iter(qrels[q]), None))


def _number(path: Path, lineno: int, text: object, what: str) -> float:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise RetrError(f"{path}:{lineno}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise RetrError(f"{path}:{lineno}: {what} {text!r} is not a finite number")
    return value


def _trec_hits(path: Path):
    for lineno, line in lines(path):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise RetrError(f"{path}:{lineno}: a TREC run line needs 6 fields (qid Q0 docid rank score tag), "
                            f"got {len(parts)}")
        yield lineno, parts[0], parts[2], _number(path, lineno, parts[4], "score")


def _msmarco_hits(path: Path):
    for lineno, line in lines(path):
        if not line.strip():
            continue
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise RetrError(f"{path}:{lineno}: an MS MARCO run line is 'qid<TAB>docid<TAB>rank', got {len(parts)} "
                            f"fields")
        rank = _number(path, lineno, parts[2], "rank")
        if rank < 1 or rank != int(rank):
            raise RetrError(f"{path}:{lineno}: rank {parts[2]!r} is not a positive integer")
        yield lineno, parts[0], parts[1], -rank


def _jsonl_hits(path: Path):
    seen: dict[str, int] = {}
    for lineno, rec in jsonl_records(path):
        if not isinstance(rec.get("qid"), str) or not isinstance(rec.get("hits"), list):
            raise RetrError(f"{path}:{lineno}: expected {{\"qid\": str, \"hits\": [...]}}")
        if rec["qid"] in seen:  # one object per query: a second would be merged into the first without a word
            raise RetrError(f"{path}:{lineno}: query {rec['qid']!r} again (first at line {seen[rec['qid']]}): "
                            f"one object per query")
        seen[rec["qid"]] = lineno
        yield lineno, rec["qid"], None, 0.0
        for h in rec["hits"]:
            if not isinstance(h, dict) or not isinstance(h.get("docid"), str) or "score" not in h:
                raise RetrError(f"{path}:{lineno}: a hit is {{\"docid\": str, \"score\": number}}, got {h!r}")
            yield lineno, rec["qid"], h["docid"], _number(path, lineno, h["score"], "score")
