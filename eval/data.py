"""Loading corpora, queries and qrels (BEIR format, or a user's JSONL/CSV) with clear errors.

Every malformed input raises ``RetrError`` naming the file and line. Datasets are found by path,
by name under ``$RETR_DATA`` (default ``~/.cache/retr/datasets``), or downloaded from BEIR's public
mirror (md5 verified) when the machine is online.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from retr.indexes.corpus import Corpus, lines, load_corpus, records
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Qrels, has_searchable_text

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
# the names BEIR publishes a zip for (those without a checksum above are downloaded with a warning naming its md5)
BEIR_DOWNLOADS = frozenset(BEIR_MD5) | {"msmarco", "trec-covid"}


def data_home() -> Path:
    return Path(os.environ.get("RETR_DATA") or Path.home() / ".cache" / "retr" / "datasets").expanduser()


def load_queries(path: str | Path, id_field: str = "_id", text_field: str = "text") -> dict[str, str]:
    return load_queries_at(path, id_field, text_field)[0]


def load_queries_at(path: str | Path, id_field: str = "_id",
                    text_field: str = "text") -> tuple[dict[str, str], dict[str, int]]:
    """The queries of ``path`` (id -> text), and the line each was read from."""
    path = Path(path)
    queries: dict[str, str] = {}
    at: dict[str, int] = {}
    for lineno, rec in records(path):
        qid = rec.get(id_field)
        if qid is None or str(qid).strip() == "":
            raise RetrError(f"{path}:{lineno}: query has no {id_field!r} field")
        qid = str(qid).strip()
        if qid in queries:
            raise RetrError(f"{path}:{lineno}: duplicate query id {qid!r}")
        queries[qid] = "" if rec.get(text_field) is None else str(rec[text_field])
        at[qid] = lineno
    return queries, at


def _grade(path: Path, lineno: int, text: str) -> int:
    """An integer relevance grade (pytrec_eval's); ``1.0`` is taken as 1, ``0.4``, ``inf`` or ``nan`` refused."""
    try:
        value = float(text)
    except ValueError:
        raise RetrError(f"{path}:{lineno}: relevance {text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise RetrError(f"{path}:{lineno}: relevance {text!r} is not an integer grade (pytrec_eval judges with "
                        f"integer grades)")
    return int(value)


# the first column's name in a qrels file's header line (BEIR's `query-id`, and the names topic files use)
QRELS_HEADERS = frozenset({"query-id", "query_id", "queryid", "qid", "query", "topic", "topic-id", "topic_id"})


def load_qrels(path: str | Path) -> Qrels:
    """Read BEIR qrels (``query-id<TAB>corpus-id<TAB>score``, header optional: ids may hold spaces) or TREC qrels
    (``qid iter docid rel``, whitespace- or tab-separated)."""
    path = Path(path)
    judgements: dict[str, dict[str, int]] = {}
    first: dict[tuple[str, str], int] = {}  # (query, document) -> the line that judged it first
    tabbed = None
    for lineno, line in lines(path):
        if not line.strip():
            continue
        header = tabbed is None  # the first line with something on it may name the columns
        if tabbed is None:
            tabbed = "\t" in line
        parts = [p.strip() for p in line.rstrip("\r\n").split("\t")] if tabbed else line.split()
        if header and parts[0].lower() in QRELS_HEADERS:
            continue
        if len(parts) == 4:  # TREC: qid iter docid rel (MS MARCO's qrels are tab-separated)
            parts = [parts[0], parts[2], parts[3]]
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise RetrError(f"{path}:{lineno}: expected 'query-id corpus-id score', got {len(parts)} fields")
        qid, did, grade = parts
        graded = judgements.setdefault(qid, {})
        value = _grade(path, lineno, grade)
        if did in graded and graded[did] != value:
            logger.warning("%s:%d: query %r, document %r judged %d here but %d at line %d: the last grade (%d) is "
                           "kept", path, lineno, qid, did, value, graded[did], first[qid, did], value)
        first.setdefault((qid, did), lineno)
        graded[did] = value
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
    empty_q = sum(1 for q in kept if not has_searchable_text(queries[q]))
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
    if not download or spec not in BEIR_DOWNLOADS:
        unknown = "" if not download else " (BEIR publishes no download of that name)"
        raise RetrError(f"dataset {spec!r} not found under {home}{unknown}: put its BEIR folder (corpus.jsonl, "
                        f"queries.jsonl, qrels/) at {candidate}, set RETR_DATA to the folder that holds it, or pass "
                        f"a folder path")
    return download_beir(spec, home)


def download_beir(name: str, home: Path, url: str | None = None, md5: str | None = None) -> Path:
    """Download and unpack BEIR's zip for ``name`` into ``home/name`` (md5-checked, atomic)."""
    from retr.retrieval.artifacts import atomic_dir

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


_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_name(name: str, what: str) -> str:
    """A name that becomes part of a file name (a split, a dataset): letters, digits, ``.``, ``_``, ``-``."""
    if not _SAFE_NAME.match(name or "") or ".." in name:
        raise RetrError(f"{what} {name!r}: use letters, digits, '.', '_' and '-' only (it names files)")
    return name


def checked_split(qrels: Qrels, all_queries: Mapping[str, str], corpus: Corpus, qrels_source: str,
                  query_at=lambda qid: "queries") -> tuple[Qrels, QrelsCheck]:
    """``clean_qrels``, then refuse a judged query without searchable text (named where ``query_at`` says it is)
    and a split with nothing left to score: a BEIR folder's and an ir_datasets collection's checks alike."""
    qrels, check = clean_qrels(qrels, all_queries, corpus, qrels_source)
    if check.queries_without_text:  # `retr search` refuses such a query: eval never scores it as a silent zero
        qid = next(q for q in qrels if not has_searchable_text(all_queries[q]))
        raise RetrError(f"{query_at(qid)}: query {qid!r} has no searchable text (empty, "
                        f"whitespace or control characters) but {Path(qrels_source).name} judges it "
                        f"({check.queries_without_text} such quer{'y' if check.queries_without_text == 1 else 'ies'}): "
                        f"give it text or remove its judgements")
    if not any(qrels.num_relevant(q) for q in qrels):
        raise RetrError(f"{qrels_source}: nothing to score: no judged query with a relevant document is left "
                        f"({check.unknown_queries} judged queries are not among the queries, {check.unknown_docs} "
                        f"judgements name documents not in the corpus)")
    return qrels, check


def load_dataset(spec: str, split: str = "test", download: bool = True) -> Dataset:
    from retr.eval.irds import irds_parts, is_irds

    if is_irds(spec):  # an ir_datasets id names its split itself
        name, corpus, all_queries, judged = irds_parts(spec)
        qrels, check = checked_split(judged, all_queries, corpus, spec)
        return Dataset(name=check_name(name, "dataset name"), path=Path(spec), split="irds", corpus=corpus,
                       queries={q: all_queries[q] for q in qrels}, qrels=qrels, check=check)
    check_name(split, "split")
    path = resolve_dataset(spec, download=download)
    qrels_path = path / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        have = sorted(p.stem for p in (path / "qrels").glob("*.tsv")) if (path / "qrels").is_dir() else []
        raise RetrError(f"{qrels_path}: no such file (splits here: {', '.join(have) or 'none'})")
    corpus = load_corpus(path / "corpus.jsonl")
    all_queries, query_lines = load_queries_at(path / "queries.jsonl")
    qrels, check = checked_split(load_qrels(qrels_path), all_queries, corpus, str(qrels_path),
                                 lambda qid: f"{path / 'queries.jsonl'}:{query_lines[qid]}")
    queries = {q: all_queries[q] for q in qrels}
    name = check_name(path.name if p_is_path(spec) else spec, "dataset name")
    return Dataset(name=name, path=path, split=split, corpus=corpus, queries=queries, qrels=qrels, check=check)


def p_is_path(spec: str) -> bool:
    return Path(spec).expanduser().is_dir()
