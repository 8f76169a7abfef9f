"""Datasets named by ``ir_datasets`` ids (``--dataset irds:beir/scifact/test``): documents, queries and qrels read
through the optional ``ir_datasets`` package (``pip install ir_datasets``).

ir_datasets downloads a collection on its first use into ``$IR_DATASETS_HOME`` (default ``~/.ir_datasets``); a
collection it already holds, or one registered from local files, is read without the network. Offline and absent,
the error says so in one line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from retr.retrieval.errors import RetrError
from retr.retrieval.types import Document

logger = logging.getLogger(__name__)

PREFIX = "irds:"
_TEXT_FIELDS = ("text", "body", "contents", "abstract", "passage")
_QUERY_FIELDS = ("text", "query", "title")


def is_irds(spec: str) -> bool:
    return spec.startswith(PREFIX)


def _module():
    try:
        import ir_datasets
    except ImportError:
        raise RetrError("--dataset irds:...: the optional ir_datasets package is not installed "
                        "(pip install ir_datasets, or pip install 'retr[irds]')") from None
    return ir_datasets


def _load(dataset_id: str):
    ir_datasets = _module()
    try:
        ds = ir_datasets.load(dataset_id)
    except KeyError:
        raise RetrError(f"ir_datasets has no dataset {dataset_id!r} (its ids look like beir/scifact/test)") from None
    missing = [part for part in ("docs", "queries", "qrels") if not getattr(ds, f"has_{part}")()]
    if missing:
        raise RetrError(f"ir_datasets dataset {dataset_id!r} has no {' or '.join(missing)}: name one with documents, "
                        f"queries and qrels (e.g. its test split)")
    return ds


def _iterate(dataset_id: str, what: str, items):
    """Everything ``items()`` yields; a failure inside ir_datasets (a download offline, a missing file) as one
    line, raised by the call that makes the iterator (``docs_iter()`` downloads) as by the iteration."""
    try:
        return list(items())
    except RetrError:
        raise
    except Exception as e:  # ir_datasets raises its own, requests' and OS errors alike
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RetrError(f"ir_datasets could not provide the {what} of {dataset_id!r} ({first}): it downloads a "
                        f"collection on first use; offline, it must already be under $IR_DATASETS_HOME "
                        f"(default ~/.ir_datasets)") from None


def _field(record, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = getattr(record, name, None)
        if isinstance(value, str):
            return value
    return None


def _document(record) -> Document:
    fields = record._asdict() if hasattr(record, "_asdict") else dict(vars(record))
    text = _field(record, _TEXT_FIELDS)
    if text is None:
        text = record.default_text() if hasattr(record, "default_text") else ""
    title = _field(record, ("title",)) or ""
    used = {"doc_id", "title", *_TEXT_FIELDS}
    metadata = {k: v for k, v in fields.items() if k not in used and _json_scalar(v)}
    return Document(str(record.doc_id), title, text, metadata)


def _json_scalar(value) -> bool:
    if value in (None, "", (), []):
        return False
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, (str, int, float, bool))


def irds_parts(spec: str):
    """``irds:<id>``'s documents as a ``Corpus`` (id, title, text; other plain fields as metadata), all its
    queries (id -> text) and its qrels; ``retr.eval.data.load_dataset`` checks them as a BEIR folder's."""
    from retr.indexes.corpus import corpus_of
    from retr.retrieval.types import Qrels

    dataset_id = spec[len(PREFIX):].strip()
    if not dataset_id:
        raise RetrError(f"--dataset {spec!r}: name an ir_datasets id after irds: (e.g. irds:beir/scifact/test)")
    ds = _load(dataset_id)
    corpus = corpus_of(_iterate(dataset_id, "documents", lambda: (_document(d) for d in ds.docs_iter())), Path(spec))
    queries: dict[str, str] = {}
    for q in _iterate(dataset_id, "queries", ds.queries_iter):
        text = _field(q, _QUERY_FIELDS)
        if text is None:
            text = q.default_text() if hasattr(q, "default_text") else ""
        queries[str(q.query_id)] = text
    judgements: dict[str, dict[str, int]] = {}
    for r in _iterate(dataset_id, "qrels", ds.qrels_iter):
        judgements.setdefault(str(r.query_id), {})[str(r.doc_id)] = int(r.relevance)
    logger.info("%s: %d documents, %d queries, %d judged", spec, len(corpus), len(queries), len(judgements))
    return dataset_id.replace("/", "_"), corpus, queries, Qrels(judgements)
