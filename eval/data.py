"""Loading corpora, queries and qrels (BEIR format, or a user's JSONL/CSV) with clear errors.

Every malformed input raises ``RetrError`` naming the file and line. Datasets are found by path,
by name under ``$RETR_DATA`` (default ``~/.cache/retr/datasets``), or downloaded from BEIR's public
mirror (md5 verified) when the machine is online.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from retr.retrieval.errors import RetrError
from retr.retrieval.types import Document, Qrels

logger = logging.getLogger(__name__)

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
# md5 of each zip as published in BEIR's README.
BEIR_MD5 = {
    "scifact": "5f7d1de60b170fc8027bb7898e2efca1",
    "nfcorpus": "a89dba18a62ef92f7d323ec890a0d38d",
    "nq": "d4d3d2e48787a744b6f6e691ff534307",
    "hotpotqa": "f412724f78b0d91183a0e86805e16114",
    "fiqa": "17918ed23cd04fb15047f73e6c3bd9d9",
    "arguana": "8ad3e3c2a5867cdced806d6503f29b99",
    "webis-touche2020": "46f650ba5a527fc69e0a6521c5a23563",
    "cqadupstack": "4e41456d7df8ee7760a7f866133bda78",
    "quora": "18fb154900ba42a600f84b839c173167",
    "dbpedia-entity": "c2a39eb420a3164af735795df012ac2c",
    "scidocs": "38121350fc3a4d2f48850f6aff52e4a9",
    "fever": "5a818580227bfb4b35bb6fa46d9b6c03",
    "climate-fever": "8b66f0a9126c521bae2bde127b4dc99d",
}


def data_home() -> Path:
    return Path(os.environ.get("RETR_DATA") or Path.home() / ".cache" / "retr" / "datasets").expanduser()


@dataclass(frozen=True)
class CorpusFormat:
    """Which fields of a JSONL/CSV record hold the id, title and text."""

    id_field: str = "_id"
    text_field: str = "text"
    title_field: str | None = "title"


@dataclass
class Corpus:
    """Documents in file order, with their content checksum and load statistics."""

    docs: list[Document]
    source: Path
    sha256: str
    empty_docs: int = 0
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


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (line number, decoded line); non-UTF-8 bytes are an error naming file:line."""
    if not path.is_file():
        raise RetrError(f"{path}: no such file")
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RetrError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if lineno == 1:
                text = text.lstrip("\ufeff")
            yield lineno, text


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise RetrError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict):
            raise RetrError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        yield lineno, rec


def _csv_records(path: Path) -> Iterator[tuple[int, dict]]:
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    text = "".join(line for _, line in _lines(path))
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    for rec in reader:
        if None in rec:
            raise RetrError(f"{path}:{reader.line_num}: more fields than the header names")
        yield reader.line_num, rec


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv", ".tab"):
        return _csv_records(path)
    return _jsonl_records(path)


def load_corpus(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> Corpus:
    """Load a corpus file (BEIR ``corpus.jsonl``, any JSONL, CSV or TSV).

    Duplicate ids and records without an id are errors; empty documents are kept (indexed as
    empty) and counted.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "corpus.jsonl"
    docs: list[Document] = []
    first_line: dict[str, int] = {}
    empty = 0
    h = hashlib.sha256()
    for lineno, rec in _records(path):
        raw_id = rec.get(fmt.id_field)
        if raw_id is None or str(raw_id).strip() == "":
            raise RetrError(f"{path}:{lineno}: record has no {fmt.id_field!r} field "
                            f"(choose the id field with --id-field)")
        doc_id = str(raw_id).strip()
        if doc_id in first_line:
            raise RetrError(f"{path}:{lineno}: duplicate document id {doc_id!r} "
                            f"(first seen at line {first_line[doc_id]})")
        first_line[doc_id] = lineno
        text = rec.get(fmt.text_field)
        title = rec.get(fmt.title_field) if fmt.title_field else None
        text = "" if text is None else str(text)
        title = "" if title is None else str(title)
        if not text.strip() and not title.strip():
            empty += 1
        doc = Document(doc_id, title, text)
        docs.append(doc)
        for part in (doc_id, title, text):
            h.update(part.encode("utf-8"))
            h.update(b"\x1f")
        h.update(b"\x1e")
    if not docs:
        raise RetrError(f"{path}: the corpus holds no documents")
    if empty:
        logger.warning("%s: %d empty document(s) indexed as empty", path, empty)
    return Corpus(docs=docs, source=path, sha256=h.hexdigest(), empty_docs=empty)


def load_queries(path: str | Path, id_field: str = "_id", text_field: str = "text") -> dict[str, str]:
    path = Path(path)
    queries: dict[str, str] = {}
    for lineno, rec in _records(path):
        qid = rec.get(id_field)
        if qid is None or str(qid).strip() == "":
            raise RetrError(f"{path}:{lineno}: query has no {id_field!r} field")
        qid = str(qid).strip()
        if qid in queries:
            raise RetrError(f"{path}:{lineno}: duplicate query id {qid!r}")
        queries[qid] = "" if rec.get(text_field) is None else str(rec[text_field])
    return queries


def load_qrels(path: str | Path) -> Qrels:
    """Read BEIR qrels (``query-id corpus-id score`` TSV, header optional) or TREC qrels."""
    path = Path(path)
    judgements: dict[str, dict[str, int]] = {}
    for lineno, line in _lines(path):
        parts = line.split()
        if not parts:
            continue
        if lineno == 1 and parts[0].lower() in ("query-id", "query_id", "qid"):
            continue
        if len(parts) == 4:  # TREC: qid iter docid rel
            parts = [parts[0], parts[2], parts[3]]
        if len(parts) != 3:
            raise RetrError(f"{path}:{lineno}: expected 'query-id corpus-id score', got {len(parts)} fields")
        qid, did, grade = parts
        try:
            g = int(float(grade))
        except ValueError:
            raise RetrError(f"{path}:{lineno}: relevance {grade!r} is not a number") from None
        judgements.setdefault(qid, {})[did] = g
    return Qrels(judgements)


@dataclass(frozen=True)
class QrelsCheck:
    unknown_queries: int
    unknown_docs: int
    queries_without_text: int


def clean_qrels(qrels: Qrels, queries: Mapping[str, str], corpus: Corpus, source: str) -> tuple[Qrels, QrelsCheck]:
    """Drop judgements naming unknown queries or documents; count and warn."""
    kept: dict[str, dict[str, int]] = {}
    unknown_q = unknown_d = 0
    for qid, docs in qrels.items():
        if qid not in queries:
            unknown_q += 1
            continue
        good = {}
        for did, g in docs.items():
            if did in corpus:
                good[did] = g
            else:
                unknown_d += 1
        if good:
            kept[qid] = good
    if unknown_q:
        logger.warning("%s: %d judged quer(ies) not in the queries file: skipped", source, unknown_q)
    if unknown_d:
        logger.warning("%s: %d judgement(s) name documents not in the corpus: skipped", source, unknown_d)
    empty_q = sum(1 for q in kept if not queries[q].strip())
    return Qrels(kept), QrelsCheck(unknown_q, unknown_d, empty_q)


@dataclass
class Dataset:
    name: str
    path: Path
    split: str
    corpus: Corpus
    queries: dict[str, str]  # only the judged queries of the split
    qrels: Qrels
    check: QrelsCheck


def resolve_dataset(spec: str, download: bool = True) -> Path:
    """A BEIR folder for ``spec``: a path, a name under $RETR_DATA, or a download."""
    p = Path(spec).expanduser()
    if p.is_dir():
        return p
    if os.sep in spec or spec.startswith("."):
        raise RetrError(f"{spec}: no such dataset folder")
    home = data_home()
    candidate = home / spec
    if candidate.is_dir():
        return candidate
    if not download:
        raise RetrError(f"dataset {spec!r} not found: put its BEIR folder (corpus.jsonl, queries.jsonl, "
                        f"qrels/) at {candidate}, or pass a folder path")
    return download_beir(spec, home)


def download_beir(name: str, home: Path, url: str | None = None, md5: str | None = None) -> Path:
    """Download and unpack BEIR's zip for ``name`` into ``home/name`` (md5-checked, atomic)."""
    from retr.indexes.atomic import atomic_dir

    url = url or BEIR_URL.format(name=name)
    md5 = md5 or BEIR_MD5.get(name)
    target = home / name
    logger.info("downloading %s from %s", name, url)
    home.mkdir(parents=True, exist_ok=True)
    fd, tmp_zip = tempfile.mkstemp(suffix=".zip", dir=home)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=30) as resp:
                    shutil.copyfileobj(resp, out)
            except (urllib.error.URLError, OSError) as e:
                raise RetrError(f"dataset {name!r} is not under {home} and could not be downloaded from {url} "
                                f"({getattr(e, 'reason', e)}): put its BEIR folder at {target} "
                                f"or set RETR_DATA") from None
        digest = hashlib.md5(Path(tmp_zip).read_bytes()).hexdigest()
        if md5 is None:
            logger.warning("no published checksum for %s; md5 of the download is %s", name, digest)
        elif digest != md5:
            raise RetrError(f"{url}: md5 {digest} does not match the published {md5}; nothing was kept")
        with atomic_dir(target) as tmp_dir, zipfile.ZipFile(tmp_zip) as zf:
            root = tmp_dir.resolve()
            for member in zf.namelist():
                if not (root / member).resolve().is_relative_to(root):
                    raise RetrError(f"{url}: zip member {member!r} escapes the target folder")
            zf.extractall(tmp_dir)
            inner = tmp_dir / name
            if inner.is_dir():  # BEIR zips hold one folder named after the dataset
                for child in inner.iterdir():
                    os.replace(child, tmp_dir / child.name)
                inner.rmdir()
            if not (tmp_dir / "corpus.jsonl").is_file():
                raise RetrError(f"{url}: the zip holds no corpus.jsonl")
    finally:
        Path(tmp_zip).unlink(missing_ok=True)
    return target


def load_dataset(spec: str, split: str = "test", download: bool = True) -> Dataset:
    path = resolve_dataset(spec, download=download)
    qrels_path = path / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        have = sorted(p.stem for p in (path / "qrels").glob("*.tsv")) if (path / "qrels").is_dir() else []
        raise RetrError(f"{qrels_path}: no such file (splits here: {', '.join(have) or 'none'})")
    corpus = load_corpus(path / "corpus.jsonl")
    all_queries = load_queries(path / "queries.jsonl")
    qrels, check = clean_qrels(load_qrels(qrels_path), all_queries, corpus, str(qrels_path))
    queries = {q: all_queries[q] for q in qrels}
    name = path.name if p_is_path(spec) else spec
    return Dataset(name=name, path=path, split=split, corpus=corpus, queries=queries, qrels=qrels, check=check)


def p_is_path(spec: str) -> bool:
    return Path(spec).expanduser().is_dir()
