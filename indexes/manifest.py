"""An index folder's manifest: written last, read first, checked against its schema before anything uses it,
and then a typed value (``IndexManifest``: frozen dataclasses, read by attribute; ``to_dict()`` for JSON)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retr.indexes.dense import dense_files
from retr.indexes.docstore import DOCS, IDS, OFFSETS, TOMBSTONES
from retr.retrieval.artifacts import MANIFEST, confined, read_small, write_json
from retr.retrieval.errors import RetrError

# 1: one generation at the folder's root; 2: generations (``gen-NNNNNN/``) published through the root's manifest
# (``retr.indexes.generations``). Both are read; an index written now is 2 once it has changed (a fresh build
# into a new folder is still 1: the older retr reads it).
INDEX_FORMAT_VERSION = 2
READ_FORMAT_VERSIONS = (1, 2)
MAX_MANIFEST_BYTES = 64 << 20  # a manifest larger than this is not read

# dotted key -> the JSON type(s) it must hold; a key under an optional (null) part is checked only when present
INDEX_SCHEMA: dict[str, tuple[type, ...]] = {
    "num_docs": (int,),
    "corpus": (dict,),
    "corpus.sha256": (str,),
    "dense": (dict,),
    "dense.kind": (str,),
    "dense.file": (str,),
    "dense.dim": (int,),
    "dense.params": (dict,),
    "dense.model": (dict,),
    "dense.model.id": (str,),
    "dense.model.hash": (str,),
    "bm25": (dict, type(None)),
    "bm25.dir": (str,),
    "files": (dict,),
}


# a folder of shard indexes: each shard is checked as an index of its own when opened
SHARDED_SCHEMA: dict[str, tuple[type, ...]] = {
    "num_docs": (int,),
    "shards": (list,),
    "corpus": (dict,),
    "corpus.sha256": (str,),
    "dense": (dict,),
    "dense.dim": (int,),
    "dense.model": (dict,),
    "dense.model.hash": (str,),
    "bm25": (dict, type(None)),
    "files": (dict,),
}


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    write_json(Path(folder) / MANIFEST, manifest)


def _lookup(manifest: dict, dotted: str):
    node: Any = manifest
    for part in dotted.split("."):
        if node is None:
            return ...  # under an optional part that is absent: not checked
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def check_schema(manifest: Any, path: Path, schema: dict[str, tuple[type, ...]] = INDEX_SCHEMA) -> None:
    if not isinstance(manifest, dict):
        raise RetrError(f"{path}: a manifest is a JSON object, this one holds a {type(manifest).__name__}")
    for key, types in schema.items():
        try:
            value = _lookup(manifest, key)
        except KeyError:
            raise RetrError(f"{path}: manifest has no {key!r}: the folder is damaged; rebuild it with `retr index`") \
                from None
        if value is ...:
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RetrError(f"{path}: manifest's {key!r} is {json.dumps(value)[:40]}, expected {want}: "
                            f"rebuild the index with `retr index`")


def read_manifest(folder: Path, kind: str, schema: dict[str, tuple[type, ...]] = INDEX_SCHEMA,
                  data: bytes | None = None, path: Path | None = None) -> dict[str, Any]:
    """The manifest of ``folder`` (or ``data``, read from ``path`` already), checked against ``schema``."""
    folder = Path(folder)
    path = path or folder / MANIFEST
    what = kind.removeprefix("retr-").replace("-", " ")  # "retr-index" -> "index"
    if data is None:
        if not folder.is_dir():
            raise RetrError(f"{folder}: no such index folder (build one with `retr index`)")
        if not path.is_file():
            raise RetrError(f"{path}: missing: {folder} is not a retr {what} folder")
        data = read_small(path, MAX_MANIFEST_BYTES)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise RetrError(f"{path}: unreadable manifest ({str(e)[:80]})") from None
    if not isinstance(manifest, dict):
        raise RetrError(f"{path}: a manifest is a JSON object, this one holds a {type(manifest).__name__}")
    if manifest.get("format") != kind:
        raise RetrError(f"{path}: a {manifest.get('format')!r} folder, not a retr {what} folder")
    if manifest.get("format_version") not in READ_FORMAT_VERSIONS:
        raise RetrError(f"{path}: format version {manifest.get('format_version')} is not supported "
                        f"(this retr reads {', '.join(map(str, READ_FORMAT_VERSIONS))}); rebuild it with `retr index`")
    check_schema(manifest, path, schema)
    return manifest


def _bad(path: Path, what: str) -> RetrError:
    return RetrError(f"{path}: {what}: the index is damaged or was tampered with; rebuild it with `retr index`")


def check_index_parts(manifest: dict, parts: Path, path: Path) -> None:
    """Every part an index's manifest names is a relative path inside ``parts`` with a checksum in ``files`` (so
    that no check can be turned off by leaving a part out), and its BM25 folder holds only recorded files."""
    files = manifest["files"]
    if not files:
        raise _bad(path, "'files' is empty (it would turn every checksum off)")
    for rel in files:
        confined(parts, rel)
    dense = manifest["dense"]
    needed = [IDS, DOCS, OFFSETS, *dense_files(dense)]
    passages = dense.get("passages")
    if passages is not None:
        if not isinstance(passages, dict):
            raise _bad(path, "'dense.passages' is not an object")
        needed += [passages.get("docs_file"), passages.get("spans_file")]
    if manifest.get("tombstones"):
        needed.append(TOMBSTONES)
    for rel in needed:
        confined(parts, rel)
        if rel not in files:
            raise _bad(path, f"{rel!r} has no checksum in 'files'")
    for part in ("bm25", "sparse"):  # a folder part: every file in it recorded, none missing
        entry = manifest.get(part)
        if not entry:
            continue
        name = entry.get("dir") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise _bad(path, f"'{part}' has no 'dir'")
        folder = confined(parts, name)
        if "/" in name:
            raise _bad(path, f"'{part}.dir' {name!r} is not a folder of the index")
        recorded = {rel.split("/", 1)[1] for rel in files if rel.startswith(name + "/")}
        if not recorded:
            raise _bad(path, f"no file of {name!r} has a checksum in 'files'")
        if folder.is_symlink() or not folder.is_dir():
            raise _bad(folder, "not a folder of the index")
        extra = sorted(set(os.listdir(folder)) - recorded)
        if extra:
            raise _bad(folder / extra[0], "not a part its manifest records")


def check_shard_entries(manifest: dict, folder: Path, path: Path) -> list[str]:
    """The shard folders a sharded manifest lists, each checked: a non-empty list of objects whose ``dir`` is a
    folder of the index with a checksum of its manifest in ``files``."""
    shards = manifest["shards"]
    if not shards:
        raise _bad(path, "'shards' is empty")
    dirs = []
    for i, entry in enumerate(shards):
        if not isinstance(entry, dict):
            raise _bad(path, f"shard {i} is a {type(entry).__name__}, not an object")
        name = entry.get("dir")
        if not isinstance(name, str) or not name:
            raise _bad(path, f"shard {i} has no 'dir'")
        confined(folder, name)
        if "/" in name or name in dirs:
            raise _bad(path, f"shard {i}'s 'dir' {name!r} is not a folder of its own in the index")
        want = manifest["files"].get(f"{name}/{MANIFEST}")
        if not isinstance(want, dict) or not isinstance(want.get("sha256"), str):
            raise _bad(path, f"shard {i} ({name}) has no manifest checksum in 'files'")
        dirs.append(name)
    return dirs


def load_manifest(folder: Path, kind: str = "retr-index") -> IndexManifest:
    """The typed manifest at ``folder``'s root (its published generation's), checked against its schema."""
    return IndexManifest.parse(read_manifest(folder, kind), Path(folder) / MANIFEST)


def is_index_folder(folder: Path, kind: str) -> bool:
    """Whether ``folder`` holds a manifest of ``kind`` (its other parts are not checked)."""
    try:
        manifest = json.loads(read_small(Path(folder) / MANIFEST, MAX_MANIFEST_BYTES))
    except (OSError, ValueError, RetrError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == kind


# -- the typed manifest -------------------------------------------------------------------------------------------
def _int(raw: Mapping, key: str, path: Path, default: int | None = None) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RetrError(f"{path}: manifest's {key!r} is {json.dumps(value)[:40]}, expected a count >= 0: rebuild "
                        f"the index with `retr index`")
    return value


def _dict(value: object) -> Mapping:
    return value if isinstance(value, dict) else {}


def _passages(dense: Mapping, path: Path) -> PassageInfo | None:
    info = dense.get("passages")
    if not info:
        return None
    try:
        return PassageInfo(_int(info, "count", path), str(info["docs_file"]), str(info["spans_file"]),
                           str(info.get("aggregate", "maxp")))
    except (KeyError, AttributeError, TypeError):
        raise RetrError(f"{path}: manifest's 'dense.passages' is incomplete: rebuild the index") from None


@dataclass(frozen=True)
class CorpusFields:
    """Which record fields held the id, text and title (None: none, or not recorded)."""
    id: str | None = None
    text: str | None = None
    title: str | None = None
    recorded: bool = False


@dataclass(frozen=True)
class CorpusInfo:
    sha256: str
    source: str | None
    num_docs: int | None
    fields: CorpusFields


@dataclass(frozen=True)
class ModelInfo:
    id: str | None
    hash: str
    backend: str | None
    query_prompt: str


@dataclass(frozen=True)
class PassageInfo:
    """An index of passages: how many vectors, the files mapping each to its document and span, the aggregate."""
    count: int
    docs_file: str
    spans_file: str
    aggregate: str


@dataclass(frozen=True)
class DenseInfo:
    kind: str | None
    file: str | None
    dim: int
    model: ModelInfo
    params: Mapping
    encode: Mapping  # how the vectors were encoded (the graph, seconds; empty where not recorded)
    passages: PassageInfo | None
    build_seconds: float
    bytes: int
    raw: Mapping = field(repr=False, compare=False)  # the whole entry (truncation, passages, ...)


@dataclass(frozen=True)
class SparseInfo:
    """The learned sparse part: its folder, the model that encoded it (id, hash, path, kind), its size."""
    dir: str
    model: Mapping
    dim: int
    nnz: int
    build_seconds: float
    bytes: int


@dataclass(frozen=True)
class BM25Info:
    dir: str | None
    params: Mapping
    build_seconds: float
    bytes: int


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


@dataclass(frozen=True)
class FileEntry:
    sha256: str | None
    bytes: int | None


@dataclass(frozen=True)
class ShardEntry:
    dir: str
    num_docs: int | None


@dataclass(frozen=True)
class IndexManifest(Mapping):
    """An index's manifest (a folder's, or a sharded folder's), checked and typed. ``format_version`` is its schema
    version. Read it by attribute; ``to_dict()`` gives the JSON as written. (Read-only mapping access to that JSON
    remains for older callers.)"""
    format: str
    format_version: int
    generation: int
    dir: str | None
    num_docs: int
    stored_docs: int
    tombstones: int
    corpus: CorpusInfo
    dense: DenseInfo
    bm25: BM25Info | None
    files: Mapping[str, FileEntry]
    sparse: SparseInfo | None
    shard_index: int | None  # this folder's place among its sharded index's shards (None: not a shard)
    shards: tuple[ShardEntry, ...]  # a sharded folder's shards (empty: one index folder)
    changes: tuple[Mapping, ...]
    config: Mapping
    raw: Mapping = field(repr=False, compare=False)

    @property
    def schema_version(self) -> int:
        return self.format_version

    @classmethod
    def parse(cls, raw: dict, path: Path) -> IndexManifest:
        """The typed value of a manifest ``check_schema`` accepted."""
        corpus, dense, model = raw["corpus"], raw["dense"], raw["dense"]["model"]
        fields = corpus.get("fields")
        recorded = isinstance(fields, dict) and bool(fields)
        fields = {k: (v if isinstance(v, str) else None) for k, v in _dict(fields).items()}
        prompts = _dict(model.get("prompts"))
        bm25 = raw.get("bm25")
        shard = raw.get("shard")
        sparse = raw.get("sparse")
        num_docs = _int(raw, "num_docs", path)
        shards = tuple(ShardEntry(e["dir"], e.get("num_docs")) for e in raw.get("shards") or ()
                       if isinstance(e, dict) and isinstance(e.get("dir"), str))
        return cls(
            format=raw["format"], format_version=raw["format_version"],
            generation=_int(raw, "generation", path, 0), dir=raw.get("dir"), num_docs=num_docs,
            stored_docs=_int(raw, "stored_docs", path, num_docs), tombstones=_int(raw, "tombstones", path, 0),
            corpus=CorpusInfo(corpus["sha256"], corpus.get("source"), corpus.get("num_docs"),
                              CorpusFields(fields.get("id"), fields.get("text"), fields.get("title"), recorded)),
            dense=DenseInfo(dense.get("kind"), dense.get("file"), dense["dim"],
                            ModelInfo(model.get("id"), model["hash"], model.get("backend"),
                                      str(prompts.get("query") or "")),
                            _dict(dense.get("params")), _dict(dense.get("encode")), _passages(dense, path),
                            _number(dense.get("build_seconds")), int(_number(dense.get("bytes"))), dense),
            bm25=None if not bm25 else BM25Info(bm25.get("dir"), _dict(bm25.get("params")),
                                                _number(bm25.get("build_seconds")), int(_number(bm25.get("bytes")))),
            files={k: FileEntry(v.get("sha256"), v.get("bytes")) if isinstance(v, dict) else FileEntry(None, None)
                   for k, v in raw["files"].items()},
            sparse=None if not isinstance(sparse, dict) or not isinstance(sparse.get("dir"), str) else SparseInfo(
                sparse["dir"], _dict(sparse.get("model")), int(_number(sparse.get("dim"))),
                int(_number(sparse.get("nnz"))), _number(sparse.get("build_seconds")), int(_number(sparse.get("bytes")))),
            shard_index=shard.get("index") if isinstance(shard, dict) and isinstance(shard.get("index"), int) else None,
            shards=shards, changes=tuple(c for c in raw.get("changes") or () if isinstance(c, dict)),
            config=_dict(raw.get("config")), raw=raw)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON holds it (a copy: changing it changes nothing here)."""
        return copy.deepcopy(dict(self.raw))

    # read-only mapping over the JSON, for callers not yet reading by attribute
    def __getitem__(self, key: str):
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    __hash__ = object.__hash__
