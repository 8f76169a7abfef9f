"""Open an index folder, checked against its manifest, with memory-mapped parts."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from retr.indexes.build import INDEX_KIND
from retr.indexes.dense import configure_search, load_faiss
from retr.indexes.docstore import DocStore, read_ids
from retr.indexes.manifest import read_manifest
from retr.retrieval.errors import RetrError


class IndexFolder:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder, INDEX_KIND)
        self.ids = read_ids(self.folder)
        n = self.manifest["num_docs"]
        if len(self.ids) != n:
            raise RetrError(f"{self.folder}: id list has {len(self.ids)} entries, manifest says {n} documents")

    @property
    def dense_info(self) -> dict:
        return self.manifest["dense"]

    @property
    def has_bm25(self) -> bool:
        return bool(self.manifest.get("bm25"))

    @cached_property
    def faiss_index(self):
        info = self.dense_info
        index = load_faiss(self.folder / info["file"])
        if index.ntotal != len(self.ids):
            raise RetrError(f"{self.folder / info['file']}: holds {index.ntotal} vectors, "
                            f"manifest says {len(self.ids)} documents")
        if index.d != info["dim"]:
            raise RetrError(f"{self.folder / info['file']}: dimension {index.d}, manifest says {info['dim']}")
        configure_search(index, info["kind"], info["params"])
        return index

    @cached_property
    def docstore(self) -> DocStore:
        store = DocStore(self.folder)
        if len(store) != len(self.ids):
            raise RetrError(f"{self.folder}: doc store holds {len(store)} documents, id list {len(self.ids)}")
        return store

    @property
    def bm25_folder(self) -> Path:
        if not self.has_bm25:
            raise RetrError(f"{self.folder}: this index has no BM25 part: rebuild it with `retr index --bm25`")
        return self.folder / self.manifest["bm25"]["dir"]

    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.folder.rglob("*") if f.is_file())
