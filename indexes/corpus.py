"""Reading a corpus (BEIR ``corpus.jsonl``, any JSONL, CSV or TSV) into documents, with clear errors.

Every malformed input raises ``RetrError`` naming the file and line. A record's other fields are kept as the
document's metadata (stored in the index, matched by search filters). Which fields hold the id, text and title is
detected from the common names where not given (and refused where two candidates are present); a build in
which most documents come out empty names the missing field and the fields the records do have.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from retr.retrieval.artifacts import not_a_file
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Document, shown

logger = logging.getLogger(__name__)

ID_FIELDS = ("_id", "id", "docid", "doc_id")
TEXT_FIELDS = ("text", "contents", "body", "abstract")
TITLE_FIELDS = ("title",)
MAX_EMPTY_SHARE = 0.5  # more documents without text than this: the text field is wrong, not the documents


@dataclass(frozen=True)
class CorpusFormat:
    """Which fields of a record hold the id, text and title. ``None``: detected from the common names;
    ``title_field=""``: no title."""

    id_field: str | None = None
    text_field: str | None = None
    title_field: str | None = None


@dataclass
class Corpus:
    """Documents in file order, with their content checksum and load statistics."""

    docs: list[Document]
    source: Path
    sha256: str
    empty_docs: int = 0
    fields: dict[str, str | None] = field(default_factory=dict)  # the fields used: id, text, title
    _positions: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._positions = {d.doc_id: i for i, d in enumerate(self.docs)}

    def __len__(self) -> int:
        return len(self.docs)

    @property
    def ids(self) -> list[str]:
        return [d.doc_id for d in self.docs]

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._positions


def lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (line number, decoded line); non-UTF-8 bytes are an error naming file:line."""
    if not path.is_file():
        raise RetrError(f"{path}: {not_a_file(path) or 'no such file'}: give a file to read")
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RetrError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if lineno == 1:
                text = text.lstrip("\ufeff")
            yield lineno, text


def jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a JSONL file; one line naming ``path:line`` for a line
    that is not a JSON object."""
    for lineno, line in lines(path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise RetrError(f"{path}:{lineno}: malformed JSON ({e.msg.removesuffix(' at')} at column {e.colno})") from None
        if not isinstance(rec, dict):
            raise RetrError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        yield lineno, rec


def _csv_records(path: Path) -> Iterator[tuple[int, dict]]:
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    text = "".join(line for _, line in lines(path))
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    for rec in reader:
        if None in rec:
            raise RetrError(f"{path}:{reader.line_num}: more fields than the header names")
        yield reader.line_num, rec


def records(path: Path) -> Iterator[tuple[int, dict]]:
    if path.suffix.lower() in (".csv", ".tsv", ".tab"):
        return _csv_records(path)
    return jsonl_records(path)


def _detect(path: Path, keys: list[str], given: str | None, candidates: tuple[str, ...], what: str,
            flag: str, required: bool) -> str | None:
    if given is not None:
        return given or None
    present = [c for c in candidates if c in keys]
    if len(present) > 1:
        raise RetrError(f"{path}: records have both {present[0]!r} and {present[1]!r}: which is the {what}? "
                        f"choose with {flag}")
    if present:
        return present[0]
    if required:
        raise RetrError(f"{path}:1: no {what} field among {', '.join(repr(c) for c in candidates)}; the records have "
                        f"{', '.join(repr(k) for k in keys) or 'no fields'}: choose with {flag}")
    return None


def _text_value(path: Path, lineno: int, name: str, value) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, dict, bool)):
        raise RetrError(f"{path}:{lineno}: field {name!r} holds a JSON {type(value).__name__}, not text")
    return str(value)


def _digest(h, doc: Document, where: str) -> None:
    """Add ``doc`` to the corpus checksum ``h`` (one definition: a file and documents held in memory alike); a
    string that is not text (a lone surrogate: valid JSON, ``"\\ud800"``, a UTF-16 pair cut in two) is an error
    naming ``where`` the document came from and its field."""
    parts = (("id", doc.doc_id), ("title", doc.title), ("text", doc.text))
    if doc.metadata:  # only where there is some: a corpus without extra fields keeps its checksum
        parts += (("metadata", json.dumps(doc.metadata, sort_keys=True, ensure_ascii=False)),)
    for name, part in parts:
        try:
            data = part.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RetrError(f"{where}: the {name} holds {e.object[e.start:e.end]!r}, a lone surrogate (half of a "
                            f"UTF-16 pair, cut from its other half): not text; fix the record") from None
        h.update(data)
        h.update(b"\x1d" if name == "metadata" else b"\x1f")
    h.update(b"\x1e")


def corpus_of(docs: list[Document], source: Path) -> Corpus:
    """A corpus of documents that come from elsewhere than a file (ir_datasets, a list in memory), checked as
    ``load_corpus`` checks a file's: ids present and unique; ``source`` names where they came from."""
    h = hashlib.sha256()
    seen: set[str] = set()
    empty = 0
    for i, doc in enumerate(docs):
        if not doc.doc_id.strip():
            raise RetrError(f"{source}: document {i + 1} has an empty id")
        if doc.doc_id in seen:
            raise RetrError(f"{source}: duplicate document id {doc.doc_id!r} (document {i + 1})")
        seen.add(doc.doc_id)
        empty += not (doc.text.strip() or doc.title.strip())
        _digest(h, doc, f"{source}: document {i + 1}")
    if not docs:
        raise RetrError(f"{source}: holds no documents")
    return Corpus(docs=list(docs), source=source, sha256=h.hexdigest(), empty_docs=empty,
                  fields={"id": "id", "text": "text", "title": "title"})


def load_corpus(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> Corpus:
    """Load a corpus file or BEIR folder. Duplicate ids, records without an id, ids that are not strings or
    numbers and texts that are not strings are errors; empty documents are kept (indexed as empty) and counted,
    unless most are empty (a wrong ``--text-field``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "corpus.jsonl"
    docs: list[Document] = []
    first_line: dict[str, int] = {}
    empty = 0
    missing_text = 0
    seen_keys: Counter[str] = Counter()
    h = hashlib.sha256()
    id_f = text_f = title_f = None
    for lineno, rec in records(path):
        if not docs:
            keys = list(rec)
            id_f = _detect(path, keys, fmt.id_field, ID_FIELDS, "id", "--id-field", True)
            text_f = _detect(path, keys, fmt.text_field, TEXT_FIELDS, "text", "--text-field", True)
            title_f = _detect(path, keys, fmt.title_field, TITLE_FIELDS, "title", "--title-field", False)
        if len(seen_keys) < 64:
            seen_keys.update(rec.keys())
        raw_id = rec.get(id_f)
        if isinstance(raw_id, (bool, list, dict)):
            raise RetrError(f"{path}:{lineno}: id field {id_f!r} holds a JSON {type(raw_id).__name__}, "
                            f"not a string or number")
        if id_f not in rec:
            raise RetrError(f"{path}:{lineno}: record has no {id_f!r} field (choose the id field with --id-field)")
        if raw_id is None or str(raw_id).strip() == "":
            raise RetrError(f"{path}:{lineno}: empty document id (field {id_f!r} is {raw_id!r}): every document "
                            f"needs one")
        doc_id = str(raw_id).strip()
        if doc_id in first_line:
            raise RetrError(f"{path}:{lineno}: duplicate document id {doc_id!r} "
                            f"(first seen at line {first_line[doc_id]})")
        first_line[doc_id] = lineno
        if text_f not in rec:
            missing_text += 1
        text = _text_value(path, lineno, text_f, rec.get(text_f))
        title = _text_value(path, lineno, title_f, rec.get(title_f)) if title_f else ""
        if not text.strip() and not title.strip():
            empty += 1
        used_fields = (id_f, text_f, title_f)
        metadata = {k: v for k, v in rec.items() if k not in used_fields and v not in (None, "", {}, [])}
        doc = Document(doc_id, title, text, metadata)
        _digest(h, doc, f"{path}:{lineno}")
        docs.append(doc)
    if not docs:
        raise RetrError(f"{path}: the corpus holds no documents")
    if max(empty, missing_text) > MAX_EMPTY_SHARE * len(docs):
        have = ", ".join(repr(k) for k, _ in seen_keys.most_common())
        why = (f"field {text_f!r} is missing from {missing_text} of them" if missing_text
               else f"field {text_f!r} is empty in them")
        raise RetrError(f"{path}: {max(empty, missing_text)} of {len(docs)} documents would have no text: {why}; the records have "
                        f"{have}: choose the text with --text-field")
    if empty:
        logger.warning("%s: %d empty document(s) indexed as empty", path, empty)
    used = {"id": id_f, "text": text_f, "title": title_f}
    if (fmt.id_field, fmt.text_field, fmt.title_field) != (id_f, text_f, title_f):
        logger.info("%s: fields used: id %r, text %r, title %r", path, id_f, text_f, title_f)
    return Corpus(docs=docs, source=path, sha256=h.hexdigest(), empty_docs=empty, fields=used)


_ID_KEYS = ("id", "_id", "doc_id")


def documents_of(docs: object) -> list[Document]:
    """``from_documents``'s input as ``Document`` s: each a str, or a dict with text, maybe id/title/metadata."""
    if isinstance(docs, (str, bytes, bytearray, Mapping)) or not isinstance(docs, Iterable):
        raise RetrError(f"docs must be a list of str or dict, got {shown(docs)}")
    out = []
    for i, doc in enumerate(docs):
        if isinstance(doc, str):
            out.append(Document(str(i), "", doc))
            continue
        if not isinstance(doc, Mapping):
            raise RetrError(f"docs[{i}] must be a str or a dict with 'text', got {shown(doc)}")
        keys = [k for k in _ID_KEYS if k in doc]
        if len(keys) > 1:
            raise RetrError(f"docs[{i}] has both {keys[0]!r} and {keys[1]!r}: which is the id?")
        doc_id = doc[keys[0]] if keys else str(i)
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            raise RetrError(f"docs[{i}][{keys[0]!r}] must be a str or int, got {shown(doc_id)}")
        text, title = doc.get("text", ""), doc.get("title", "")
        for name, value in (("text", text), ("title", title)):
            if not isinstance(value, str):
                raise RetrError(f"docs[{i}][{name!r}] must be a str, got {shown(value)}")
        if "text" not in doc and "title" not in doc:
            raise RetrError(f"docs[{i}] has no 'text' (nor 'title'): fields {', '.join(map(repr, doc)) or 'none'}")
        metadata = {k: v for k, v in doc.items() if k not in (*keys, "text", "title") and v not in (None, "", {}, [])}
        try:
            json.dumps(metadata)
        except (TypeError, ValueError):
            raise RetrError(f"docs[{i}]: its other fields must be JSON values (str, number, bool, list, dict): "
                            f"{', '.join(map(repr, metadata))}") from None
        out.append(Document(str(doc_id).strip(), title, text, metadata))
    return out
