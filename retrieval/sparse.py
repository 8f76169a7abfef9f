"""Learned sparse retrieval: a sentence-transformers ``SparseEncoder`` (SPLADE or CSR) turns texts into sparse
vectors; documents are rows of a CSR matrix, searched exactly (scipy sparse dot products) or approximately (Seismic,
``pyseismic-lsr``, built from the same rows when first searched).

A model is named as every other model role names one (``ModelRef``: a folder, a hub id through the local cache, or
the bundled MiniLM's aliases); a folder that is not a ``SparseEncoder`` is refused before anything loads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef, require_model_type
from retr.retrieval.protocol import StageTimer
from retr.retrieval.stage import Stage
from retr.retrieval.types import Hit, Run, trec_sorted

logger = logging.getLogger(__name__)

SPARSE_MODEL_TYPE = "SparseEncoder"
ENGINES = ("exact", "seismic")
QUERY_CHUNK = 64  # queries scored at once by the exact path: (64, documents) float32 at most


@dataclass(frozen=True)
class SparseConfig:
    """Which sparse encoder (a folder or hub id), how long its inputs are, and how a query is searched."""
    model: str
    max_length: int | None = None  # None: the model's own
    batch_size: int = 32
    engine: str = "exact"  # exact | seismic
    query_cut: int = 10  # seismic: a query's heaviest dimensions searched
    heap_factor: float = 0.7  # seismic: how far below the k-th score a block is still visited
    # torch threads while a few queries are encoded: one short query gains nothing from intra-op threads, and on a
    # busy 2-core AVX2 EPYC two threads took 1468 ms a query against 85 ms for one (MiniLM CSR; the study page)
    query_threads: int = 1

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise RetrError(f"sparse engine {self.engine!r}: choose one of {', '.join(ENGINES)}")


def sparse_kind(path: Path) -> str:
    """``splade`` or ``csr`` for a ``SparseEncoder`` folder; a ``RetrError`` naming the folder for any other kind
    (a dense sentence-transformers model, a bare transformers folder)."""
    require_model_type(path, SPARSE_MODEL_TYPE, "a sparse encoder", "sparse-encoder")
    try:
        modules = json.loads((path / "modules.json").read_text())
    except (OSError, ValueError):
        modules = []
    types = " ".join(str(m.get("type", "")) for m in modules if isinstance(m, dict))
    return "csr" if "SparseAutoEncoder" in types else "splade"


class SparseEncoderModel:
    """A ``SparseEncoder`` loaded on the CPU, returning scipy CSR rows (float32)."""

    def __init__(self, config: SparseConfig, ref: ModelRef | None = None):
        self.config = config
        self.ref = ref or ModelRef.resolve(config.model)
        self.kind = sparse_kind(self.ref.path)
        self._model = None

    @property
    def model(self):
        if self._model is None:
            from sentence_transformers import SparseEncoder

            self._model = SparseEncoder(str(self.ref.path), device="cpu", local_files_only=True)
            if self.config.max_length:
                self._model.max_seq_length = self.config.max_length
        return self._model

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())

    @property
    def max_length(self) -> int:
        return int(self.model.max_seq_length)

    def describe(self) -> dict:
        return {"id": self.ref.id, "hash": self.ref.hash, "path": str(self.ref.path), "kind": self.kind,
                "max_length": self.max_length}

    def _encode(self, texts: Sequence[str], query: bool, show_progress: bool = False):
        import scipy.sparse as sp

        texts = list(texts)
        if not texts:
            return sp.csr_matrix((0, self.dim), dtype=np.float32)
        import torch

        encode = self.model.encode_query if query else self.model.encode_document
        threads = torch.get_num_threads()
        few = query and len(texts) <= self.config.batch_size and self.config.query_threads > 0
        if few:
            torch.set_num_threads(min(threads, self.config.query_threads))
        try:
            out = encode(texts, batch_size=self.config.batch_size, convert_to_tensor=True,
                         convert_to_sparse_tensor=True, show_progress_bar=show_progress, save_to_cpu=True)
        finally:
            if few:
                torch.set_num_threads(threads)
        coo = out.coalesce()
        rows, cols = coo.indices().numpy()
        values = coo.values().float().numpy()
        keep = values != 0
        matrix = sp.csr_matrix((values[keep], (rows[keep], cols[keep])), shape=tuple(coo.shape), dtype=np.float32)
        matrix.sort_indices()
        return matrix

    def encode_documents(self, texts: Sequence[str], show_progress: bool = False):
        return self._encode(texts, False, show_progress)

    def encode_queries(self, texts: Sequence[str]):
        return self._encode(texts, True)


def sparse_encoder_for(folder, model: Mapping, engine: str = "exact") -> SparseEncoderModel:
    """The query encoder of an index's sparse part (``model``: its manifest's ``sparse.model``): the folder it was
    built with where it still exists, else its id; refused where that model's content hash is not the one
    recorded."""
    path = model.get("path")
    name = path if path and Path(path).is_dir() else model.get("id")
    if not isinstance(name, str):
        raise RetrError(f"{folder}: the manifest's sparse part names no model: rebuild the index")
    encoder = SparseEncoderModel(SparseConfig(name, max_length=model.get("max_length"), engine=engine))
    if encoder.ref.hash != model.get("hash"):
        raise RetrError(f"{folder}: its sparse part was built with {model.get('id')} (hash "
                        f"{str(model.get('hash'))[:12]}) but {name} now has hash {encoder.ref.hash[:12]}: rebuild "
                        f"the index")
    return encoder


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` highest positive ``scores`` (ties at the cut all kept: trec order picks)."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < len(scores):
        top = np.argpartition(-scores, k - 1)[:k]
        top = np.union1d(top, np.flatnonzero(scores == scores[top].min()))
    else:
        top = np.arange(len(scores))
    return top[scores[top] > 0]


class SparseRetriever:
    """Retriever protocol over CSR document rows (row i = ``ids[i]``) and a sparse query encoder."""

    name = "splade"
    stages = ("splade_encode", "splade")

    def __init__(self, matrix, ids: Sequence[str], encoder: SparseEncoderModel, allowed: np.ndarray | None = None,
                 engine: str | None = None):
        if matrix.shape[0] != len(ids):
            raise RetrError(f"sparse index holds {matrix.shape[0]} rows but the id list has {len(ids)}")
        self.matrix = matrix.tocsr()
        self.ids = list(ids)
        self.encoder = encoder
        self.allowed = allowed
        self.engine = engine or encoder.config.engine
        self._transposed = None
        self._seismic = None

    def restricted(self, allowed: np.ndarray | None) -> SparseRetriever:
        if allowed is None:
            return self
        other = SparseRetriever.__new__(SparseRetriever)
        other.__dict__.update(self.__dict__)
        other.allowed = allowed
        return other

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        qids = list(queries)
        if not qids:
            return Run({})
        with timer.stage("splade_encode"):
            q = self.encoder.encode_queries([queries[x] for x in qids])
        with timer.stage("splade"):
            return self.search_vectors(qids, q, k)

    def search_vectors(self, qids: list[str], q, k: int) -> Run:
        if self.engine == "seismic" and self.allowed is None:
            return self._seismic_search(qids, q, k)
        return self._exact(qids, q, k)

    def _exact(self, qids: list[str], q, k: int) -> Run:
        """Every document's dot product with each query: (queries x dim) @ (dim x docs), a chunk of queries at a
        time."""
        if self._transposed is None:
            self._transposed = self.matrix.T.tocsr()
        ids, out = self.ids, {}
        for start in range(0, len(qids), QUERY_CHUNK):
            scores = (q[start:start + QUERY_CHUNK] @ self._transposed).toarray()
            for row, qid in enumerate(qids[start:start + QUERY_CHUNK]):
                s = scores[row]
                if self.allowed is not None:
                    masked = np.zeros_like(s)
                    masked[self.allowed] = s[self.allowed]
                    s = masked
                top = top_k(s, k)
                out[qid] = trec_sorted(Hit(ids[d], float(v)) for d, v in zip(top.tolist(), s[top].tolist(),
                                                                               strict=True))[:k]
        return Run(out)

    @property
    def seismic(self):
        """The Seismic index of the rows (built once, in memory, from the CSR part the folder stores)."""
        if self._seismic is None:
            self._seismic = build_seismic(self.matrix)
        return self._seismic

    def _seismic_search(self, qids: list[str], q, k: int) -> Run:
        from seismic import get_seismic_string

        string = get_seismic_string()
        cfg = self.encoder.config
        q = q.tocsr()
        components = [q.indices[q.indptr[i]:q.indptr[i + 1]].astype(str).astype(string) for i in range(len(qids))]
        values = [q.data[q.indptr[i]:q.indptr[i + 1]].astype(np.float32) for i in range(len(qids))]
        found = self.seismic.batch_search(queries_ids=np.array([str(i) for i in range(len(qids))], dtype=string),
                                          query_components=components, query_values=values, k=min(k, len(self.ids)),
                                          query_cut=cfg.query_cut, heap_factor=cfg.heap_factor, num_threads=1)
        out: dict[str, list[Hit]] = {qid: [] for qid in qids}
        ids = self.ids
        for result in found:
            if result:
                qid = qids[int(result[0][0])]
                out[qid] = trec_sorted(Hit(ids[int(d)], float(s)) for _, s, d in result if s > 0)[:k]
        return Run(out)


def build_seismic(matrix, **params):
    """A Seismic index over CSR rows (documents named by their row number)."""
    try:
        from seismic import SeismicDataset, SeismicIndex
    except ImportError:
        raise RetrError("the seismic engine needs pyseismic-lsr: pip install 'retr[sparse]'") from None
    matrix = matrix.tocsr()
    matrix.sort_indices()
    dataset = SeismicDataset()
    dataset.add_documents_by_id([str(i) for i in range(matrix.shape[0])], matrix.indices.astype(np.int64),
                                matrix.data.astype(np.float32), matrix.indptr.astype(np.int64))
    return SeismicIndex.build_from_dataset(dataset, **params)


STAGE = Stage("splade", "source", lambda ctx, node, inputs: ctx.parts.sparse(ctx.allowed, ctx.config.sparse_engine),
              "the learned sparse encoder's query vector against the index's sparse part", needs=("sparse",))
