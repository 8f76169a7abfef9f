"""Open an index folder, checked against its manifest, with memory-mapped parts (checked before each read).

An index opens one generation (``retr.indexes.generations``: the one its manifest points to, leased while it is
open) and reads every part from it, the ones loaded lazily too. On open: the manifest's schema, that every part
it names is a relative path inside the generation with a checksum (``manifest.check_index_parts``), the size of
every part (a regular file: never a symlink or special file), and the checksum of every part small enough to hash
cheaply (the id list, the doc store's offsets, the BM25 vocabulary and parameters); a part that fails is named and
the folder refused.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from retr.indexes.dense import configure_search, load_faiss
from retr.indexes.docstore import DocStore, read_ids, read_tombstones
from retr.indexes.generations import Opened, generation_dir, open_generation
from retr.indexes.manifest import IndexManifest, check_index_parts, read_manifest
from retr.retrieval.artifacts import check_checksums, check_sizes, confined
from retr.retrieval.errors import RetrError
from retr.retrieval.passages import PassageMap

INDEX_KIND = "retr-index"
HASH_ON_OPEN_BYTES = 64 << 20  # parts up to this size are hashed on every open; larger ones are checked by size


class ManifestView:
    """What an index says about itself through its manifest (a folder, or a folder of shards)."""
    manifest: IndexManifest
    _opened: Opened | None = None

    @property
    def generation(self) -> int:
        """The number of the generation this index opened (its manifest's ``generation``; 0: as first built)."""
        return self._opened.number if self._opened is not None else self.manifest.generation

    def _release(self) -> None:
        if self._opened is not None:
            self._opened.release()

    @property
    def dense_info(self) -> dict:
        """The manifest's whole dense entry, as JSON holds it (the typed fields: ``manifest.dense``)."""
        return self.manifest.dense.raw

    @property
    def has_bm25(self) -> bool:
        return self.manifest.bm25 is not None

    def damage(self) -> str | None:
        """The first part of the opened generation now missing or of another size than its manifest records (a
        stat each: cheap), or None: a part changed on disk under this reader (a backup restored over it)."""
        parts = self._opened.parts if self._opened is not None else self.parts
        bad = check_sizes(parts, {rel: {"bytes": f.bytes} for rel, f in self.manifest.files.items()
                                  if f.bytes is not None})
        return bad or next((d for s in getattr(self, "shards", ()) if (d := s.damage())), None)

    @property
    def has_sparse(self) -> bool:
        return self.manifest.sparse is not None


def open_manifest(opened: Opened, kind: str, schema=None) -> dict:
    """The opened generation's manifest (its JSON), checked: its schema, and that it names the generation it lies
    in."""
    kwargs = {} if schema is None else {"schema": schema}
    manifest = read_manifest(opened.root, kind, data=opened.data, path=opened.manifest_path, **kwargs)
    if opened.parts != opened.root:
        try:
            name = generation_dir(manifest.get("dir"))
        except ValueError as e:
            raise RetrError(f"{opened.manifest_path}: 'dir' {e}: rebuild the index") from None
        if name != opened.parts.name or manifest.get("generation") != opened.number:
            raise RetrError(f"{opened.manifest_path}: names generation {manifest.get('generation')} in {name}, "
                            f"not the folder it lies in: the index is damaged; rebuild it")
    return manifest


class IndexFolder(ManifestView):
    def __init__(self, folder: str | Path, opened: Opened | None = None, flat: bool = False):
        """``folder``: an index folder (its current generation is opened and leased; or ``opened``, one already
        opened); ``flat``: a shard inside a generation its sharded index holds (read where it lies)."""
        self.folder = Path(folder)
        if flat:
            self.parts = self.folder
            self._check(read_manifest(self.folder, INDEX_KIND))
        else:
            self._opened = opened or open_generation(self.folder)
            try:
                self.parts = self._opened.parts
                self._check(open_manifest(self._opened, INDEX_KIND))
            except BaseException:
                self._release()
                raise

    def _check(self, raw: dict) -> None:
        path = self.folder / "manifest.json"
        check_index_parts(raw, self.parts, path)
        self.manifest = m = IndexManifest.parse(raw, path)
        bad = check_checksums(self.parts, raw["files"], hash_up_to=HASH_ON_OPEN_BYTES)
        if bad:
            raise RetrError(f"{bad}: the index is damaged; rebuild it with `retr index`")
        self.stored_ids = read_ids(self.parts)  # the id at every stored position, tombstoned ones included
        stored = m.stored_docs
        if len(self.stored_ids) != stored:
            raise RetrError(f"{self.folder}: id list has {len(self.stored_ids)} entries, manifest says {stored} stored")
        self.tombstones = read_tombstones(self.parts, stored)  # deleted positions, sorted
        dead = self.tombstones
        if len(dead) != m.tombstones:
            raise RetrError(f"{self.folder}: {len(dead)} tombstones, manifest says {m.tombstones}")
        # rows: the live positions in order; every part but the doc store and the id list holds rows only
        self.rows: np.ndarray | None = np.setdiff1d(np.arange(stored), dead) if len(dead) else None
        self.ids = self.stored_ids if self.rows is None else [self.stored_ids[p] for p in self.rows.tolist()]
        n = m.num_docs
        if len(self.ids) != n:
            raise RetrError(f"{self.folder}: id list has {len(self.ids)} live entries, manifest says {n} documents")

    @cached_property
    def faiss_index(self):
        info = self.manifest.dense
        index = load_faiss(self.parts, info.raw)
        rows = len(self.passages) if self.passages is not None else len(self.ids)
        if index.ntotal != rows:
            raise RetrError(f"{self.parts / info.file}: holds {index.ntotal} vectors, manifest says {rows} "
                            f"{'passages' if self.passages is not None else 'documents'}")
        if index.d != info.dim:
            raise RetrError(f"{self.parts / info.file}: dimension {index.d}, manifest says {info.dim}")
        try:
            configure_search(index, info.kind, info.params)
        except (KeyError, TypeError, ValueError) as e:
            raise RetrError(f"{self.folder}: manifest's dense params are incomplete ({e}): rebuild the index") from None
        return index

    @cached_property
    def passages(self) -> PassageMap | None:
        """Which document each vector belongs to, for an index of passages (None: one vector per document)."""
        info = self.manifest.dense.passages
        if info is None:
            return None
        try:
            # read whole (24 bytes a passage), never mapped: a file cut short under a map would be SIGBUS
            docs = np.load(confined(self.parts, info.docs_file), allow_pickle=False)
            spans = np.load(confined(self.parts, info.spans_file), allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise RetrError(f"{self.folder}: passage map unreadable ({e}): rebuild the index") from None
        if docs.shape != (info.count,) or spans.shape != (info.count, 2) or \
                (len(docs) and (int(docs[0]) != 0 or int(docs[-1]) != len(self.ids) - 1
                                or bool((np.diff(docs) < 0).any()))):
            raise RetrError(f"{self.parts / info.docs_file}: does not map {info.count} passages onto "
                            f"{len(self.ids)} documents in order: rebuild the index")
        return PassageMap(docs, spans, info.aggregate, len(self.ids))

    @cached_property
    def docstore(self) -> DocStore:
        store = DocStore(self.parts, self.stored_ids, self.rows)
        if store.stored != len(self.stored_ids):
            store.close()
            raise RetrError(f"{self.folder}: doc store holds {store.stored} documents, id list {len(self.stored_ids)}")
        return store

    @property
    def bm25_folder(self) -> Path:
        if not self.has_bm25:
            raise RetrError(f"{self.folder}: this index has no BM25 part: rebuild it with `retr index`, without --no-bm25")
        return confined(self.parts, self.manifest.bm25.dir)

    @cached_property
    def sparse_matrix(self):
        """The learned sparse part: one CSR row per live document (``retr.indexes.sparse``)."""
        from retr.indexes.sparse import load_sparse

        if not self.has_sparse:
            raise RetrError(f"{self.folder}: this index has no sparse part: rebuild it with `retr index --sparse-model "
                            f"MODEL`")
        return load_sparse(confined(self.parts, self.manifest.sparse.dir), len(self.ids))

    def close(self) -> None:
        """Close the doc store and give the generation's lease back (a writer may then remove it)."""
        if "docstore" in self.__dict__:
            self.docstore.close()
            del self.__dict__["docstore"]
        self._release()
