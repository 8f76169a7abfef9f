"""Topic files (the queries of a batch search or an evaluation) in the forms IR collections ship them.

- TSV: ``id<TAB>query`` per line (MS MARCO's ``queries.tsv``); a header line ``qid<TAB>query`` is skipped.
- JSONL: one object per line with an id (``id``, ``_id``, ``qid`` or ``query_id``) and a text (``text``, ``query``
  or ``title``): BEIR's ``queries.jsonl`` is one.
- TREC topics: ``<top> <num> Number: 301 <title> ... <desc> ... <narr> ... </top>`` blocks (closing tags such as
  ``</title>`` are allowed); the query is the ``title`` field unless another is asked for.

Every malformed input raises ``RetrError`` naming the file and line, a topic whose text holds no searchable
character (``has_searchable_text``, the search request's test: NUL, control or zero-width characters alone)
included. Topics keep their file order.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from retr.eval.forms import file_and_form
from retr.indexes.corpus import jsonl_records, lines
from retr.retrieval.errors import RetrError
from retr.retrieval.request import MAX_QUERY_CHARS
from retr.retrieval.types import has_searchable_text

TOPIC_FORMATS = ("tsv", "jsonl", "trec")
TREC_FIELDS = ("title", "desc", "narr")
ID_KEYS = ("id", "_id", "qid", "query_id")
TEXT_KEYS = ("text", "query", "title")
_HEADER_IDS = frozenset((*ID_KEYS, "query-id", "topic"))
_HEADER_TEXTS = frozenset(("query", "text", "title", "query_text"))
_TREC_PREFIX = {"num": "number:", "title": "topic:", "desc": "description:", "narr": "narrative:"}
_TREC_TAG = re.compile(r"<(/?)(num|title|desc|narr)>", re.IGNORECASE)
_TOP = re.compile(r"<top>(.*?)</top>", re.IGNORECASE | re.DOTALL)


def topic_format(path: Path) -> str:
    """The form of a topic file: from its suffix (.jsonl/.json, .tsv), else from its first non-blank line."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    for lineno, line in lines(path):
        head = line.strip()
        if not head:
            continue
        if head.lower().startswith("<top>"):
            return "trec"
        if suffix in (".tsv", ".tab", ".txt") or "\t" in head:
            return "tsv"
        if head.startswith("{"):
            return "jsonl"
        raise RetrError(f"{path}:{lineno}: not a topic file: expected 'id<TAB>query' (TSV), a JSON object per line "
                        f"or TREC <top> blocks")
    raise RetrError(f"{path}: holds no topic")


def read_topics(path: str | Path, fmt: str | None = None, field: str = "title") -> dict[str, str]:
    """Query id -> query text, in file order. ``fmt``: one of ``TOPIC_FORMATS`` (default: detected);
    ``field``: which field of a TREC topic is the query."""
    path, fmt = file_and_form(path, fmt, TOPIC_FORMATS, topic_format, "topic")
    if field not in TREC_FIELDS:
        raise RetrError(f"topic field {field!r}: choose one of {', '.join(TREC_FIELDS)}")
    topics = {"tsv": _tsv, "jsonl": _jsonl, "trec": lambda p: _trec(p, field)}[fmt](path)
    if not topics:
        raise RetrError(f"{path}: holds no topic")
    return topics


def topic_id_problem(qid: str) -> str | None:
    """What is wrong with ``qid`` as a topic id (None: nothing): it must hold something and no control character
    (a NUL went into a TREC run as it was); surrounding whitespace is a file's, never an id's."""
    if not qid or not qid.strip():
        return "topic has no id"
    if qid != qid.strip():
        return f"topic id {qid!r} has surrounding whitespace"
    if any(unicodedata.category(c) == "Cc" for c in qid):
        return f"topic id {qid!r} holds a control character"
    return None


def topic_problem(qid: str, text: object) -> str | None:
    """What is wrong with a topic (None: nothing): its id (``topic_id_problem``), or its text as the search request
    would refuse it, said here with the topic's id (and, from a file, its line)."""
    problem = topic_id_problem(qid)
    if problem:
        return problem
    if not isinstance(text, str):
        return f"topic {qid!r}: its query is not a str"
    if not has_searchable_text(text):  # the search request's own test
        what = "holds no searchable character (only control, format or zero-width ones)" if text.strip() \
            else "has no query text"
        return f"topic {qid!r} {what}"
    if len(text.strip()) > MAX_QUERY_CHARS:  # the request's bound
        return f"topic {qid!r} is longer than {MAX_QUERY_CHARS:,} characters ({len(text.strip()):,})"
    return None


def _add(topics: dict[str, str], path: Path, lineno: int, qid: str, text: str) -> None:
    qid = qid.strip()
    problem = topic_problem(qid, text)
    if problem:
        raise RetrError(f"{path}:{lineno}: {problem}")
    if qid in topics:
        raise RetrError(f"{path}:{lineno}: duplicate topic id {qid!r}")
    topics[qid] = text.strip()


def _tsv(path: Path) -> dict[str, str]:
    topics: dict[str, str] = {}
    for lineno, line in lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        qid, tab, text = line.partition("\t")
        if not tab:
            raise RetrError(f"{path}:{lineno}: expected 'id<TAB>query', found no tab")
        if not topics and qid.strip().lower() in _HEADER_IDS and text.strip().lower() in _HEADER_TEXTS:
            continue  # a header line
        _add(topics, path, lineno, qid, text)
    return topics


def _jsonl(path: Path) -> dict[str, str]:
    topics: dict[str, str] = {}
    for lineno, rec in jsonl_records(path):
        id_key = next((k for k in ID_KEYS if k in rec), None)
        text_key = next((k for k in TEXT_KEYS if k in rec), None)
        if id_key is None:
            raise RetrError(f"{path}:{lineno}: topic has no id field (one of {', '.join(ID_KEYS)})")
        if text_key is None:
            raise RetrError(f"{path}:{lineno}: topic has no text field (one of {', '.join(TEXT_KEYS)})")
        qid, text = rec[id_key], rec[text_key]
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise RetrError(f"{path}:{lineno}: topic id {qid!r} is not a string or an integer")
        if not isinstance(text, str):
            raise RetrError(f"{path}:{lineno}: field {text_key!r} is not a string")
        _add(topics, path, lineno, str(qid), text)
    return topics


def _trec(path: Path, field: str) -> dict[str, str]:
    text = "".join(line for _, line in lines(path))  # decoded and checked line by line
    topics: dict[str, str] = {}
    end = 0
    for m in _TOP.finditer(text):
        _outside(path, text, end, m.start())
        end = m.end()
        lineno = text.count("\n", 0, m.start()) + 1
        fields = _trec_fields(m.group(1))
        if "num" not in fields:
            raise RetrError(f"{path}:{lineno}: topic has no <num>")
        if field not in fields:
            raise RetrError(f"{path}:{lineno}: topic {fields['num']!r} has no <{field}>")
        _add(topics, path, lineno, fields["num"], fields[field])
    _outside(path, text, end, len(text))
    return topics


def _outside(path: Path, text: str, start: int, stop: int) -> None:
    """Text between topics must be blank: a stray or unclosed ``<top>`` is an error, not a skipped topic."""
    stray = text[start:stop]
    if stray.strip():
        offset = start + len(stray) - len(stray.lstrip())
        lineno = text.count("\n", 0, offset) + 1
        what = "a <top> without </top>" if "<top>" in stray.lower() else "text outside <top> ... </top>"
        raise RetrError(f"{path}:{lineno}: {what}")


def _trec_fields(block: str) -> dict[str, str]:
    """A topic's fields: each tag's text runs to the next tag; ``Number:`` and the like are dropped."""
    out: dict[str, str] = {}
    tags = list(_TREC_TAG.finditer(block))
    for i, tag in enumerate(tags):
        if tag.group(1):  # a closing tag
            continue
        name = tag.group(2).lower()
        value = block[tag.end(): tags[i + 1].start() if i + 1 < len(tags) else len(block)]
        value = " ".join(value.split())
        if value.lower().startswith(_TREC_PREFIX[name]):
            value = value[len(_TREC_PREFIX[name]):].strip()
        out.setdefault(name, value)
    return out
