"""An index folder's manifest: written last, read first, checked against its schema before anything uses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from retr.retrieval.artifacts import FORMAT_VERSION, MANIFEST, write_json
from retr.retrieval.errors import RetrError

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


def read_manifest(folder: Path, kind: str, schema: dict[str, tuple[type, ...]] = INDEX_SCHEMA) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST
    what = kind.removeprefix("retr-").replace("-", " ")  # "retr-index" -> "index"
    if not folder.is_dir():
        raise RetrError(f"{folder}: no such index folder (build one with `retr index`)")
    if not path.is_file():
        raise RetrError(f"{path}: missing: {folder} is not a retr {what} folder")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RetrError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise RetrError(f"{path}: a manifest is a JSON object, this one holds a {type(manifest).__name__}")
    if manifest.get("format") != kind:
        raise RetrError(f"{path}: a {manifest.get('format')!r} folder, not a retr {what} folder")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise RetrError(f"{path}: format version {manifest.get('format_version')} is not supported "
                        f"(this retr reads {FORMAT_VERSION}); rebuild it with `retr index`")
    check_schema(manifest, path, schema)
    return manifest


def is_index_folder(folder: Path, kind: str) -> bool:
    """Whether ``folder`` holds a manifest of ``kind`` (its other parts are not checked)."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == kind
