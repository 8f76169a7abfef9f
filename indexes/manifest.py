"""The manifest every retr artifact carries: what it is, how it was built, and from what."""

from __future__ import annotations

import json
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from retr.retrieval.errors import RetrError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("retr", "faiss-cpu", "torch", "sentence-transformers", "transformers", "bm25s", "numpy", "onnxruntime",
                "openvino"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def new_manifest(kind: str, **fields: Any) -> dict[str, Any]:
    return {"format": kind, "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields, "versions": versions()}


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def read_manifest(folder: Path, kind: str) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise RetrError(f"{folder}: no such index folder (build one with `retr index`)")
    if not path.is_file():
        raise RetrError(f"{path}: missing: {folder} is not a retr {kind} folder")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RetrError(f"{path}: unreadable manifest ({e})") from None
    if manifest.get("format") != kind:
        raise RetrError(f"{path}: a {manifest.get('format')!r} folder, not a retr {kind}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise RetrError(f"{path}: format version {manifest.get('format_version')} is not supported "
                        f"(this retr reads {FORMAT_VERSION}); rebuild it with `retr index`")
    return manifest
