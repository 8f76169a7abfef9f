"""Late interaction (ColBERT-style MaxSim): the ``maxsim`` stage reranks the top ``depth`` hits of the pipeline
before it by a sentence-transformers ``MultiVectorEncoder``: each query token's best match among a document's
token vectors, summed.

The model is named as every model role names one (``ModelRef``) and given as ``PipelineConfig.multivector_model``
(``--multivector-model``); a folder that is not a ``MultiVectorEncoder`` is refused before anything loads. The
documents' token vectors are encoded once per (model, corpus, id list, length) and kept in
``$RETR_CACHE/multivector/<key>/``: ``vectors.npy`` (float16, the model's projected dimension), ``offsets.npy``
(each document's first row) and ``meta.json`` (written last, with both files' sha256, checked on read).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from retr.retrieval.artifacts import atomic_dir, cache_home, file_sha256, read_small, write_json
from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef, require_model_type
from retr.retrieval.progress import Progress
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.rerank_check import rerank_head
from retr.retrieval.stage import Option, Stage
from retr.retrieval.types import Hit, Run

logger = logging.getLogger(__name__)

MODEL_TYPE = "MultiVectorEncoder"
ENCODE_CHUNK = 256  # documents encoded per call (one progress step)


class MultiVectorModel:
    """A ``MultiVectorEncoder`` loaded on the CPU: token vectors as float32 arrays, one per text."""

    def __init__(self, model: str, max_length: int | None = None):
        self.ref = ModelRef.resolve(model)
        require_model_type(self.ref.path, MODEL_TYPE, "a multi-vector encoder", "multi-vector")
        self.max_length = max_length
        self._model = None

    @property
    def model(self):
        if self._model is None:
            from sentence_transformers import MultiVectorEncoder

            self._model = MultiVectorEncoder(str(self.ref.path), device="cpu", local_files_only=True)
            if self.max_length:
                self._model.max_seq_length = self.max_length
        return self._model

    def encode_documents(self, texts: Sequence[str], what: str = "token vectors") -> tuple[np.ndarray, np.ndarray]:
        """Every text's token vectors stacked (float16) and each text's first row (``len(texts) + 1`` offsets)."""
        parts, counts = [], [0]
        with Progress(len(texts), what) as progress:
            for start in range(0, len(texts), ENCODE_CHUNK):
                for v in self.model.encode_document(list(texts[start:start + ENCODE_CHUNK]), convert_to_numpy=True,
                                                    show_progress_bar=False):
                    parts.append(np.asarray(v, dtype=np.float16))
                    counts.append(len(v))
                progress.update(min(ENCODE_CHUNK, len(texts) - start))
        dim = parts[0].shape[1] if parts else 0
        return (np.concatenate(parts) if parts else np.zeros((0, dim), np.float16)), np.cumsum(counts, dtype=np.int64)

    def encode_query(self, text: str) -> np.ndarray:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one short query: intra-op threads cost more than they give (as the sparse stage)
        try:
            return np.asarray(self.model.encode_query([text], convert_to_numpy=True, show_progress_bar=False)[0],
                              dtype=np.float32)
        finally:
            torch.set_num_threads(threads)


class TokenStore:
    """The token vectors of an index's documents by row, kept in the cache, checked on read."""

    def __init__(self, vectors: np.ndarray, offsets: np.ndarray):
        self.vectors, self.offsets = vectors, offsets

    @staticmethod
    def key(model: MultiVectorModel, corpus_sha256: str, ids: Sequence[str]) -> str:
        digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()
        raw = f"{model.ref.hash}|{corpus_sha256}|{digest}|{model.max_length or 0}"
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    @classmethod
    def load(cls, folder: Path, rows: int) -> TokenStore | None:
        if not folder.is_dir():
            return None
        try:
            meta = json.loads(read_small(folder / "meta.json"))
            for name in ("vectors", "offsets"):
                if file_sha256(folder / f"{name}.npy") != meta[name]:
                    raise ValueError(f"{name}.npy differs from its checksum")
            vectors = np.load(folder / "vectors.npy", mmap_mode="r", allow_pickle=False)
            offsets = np.load(folder / "offsets.npy", allow_pickle=False)
            if len(offsets) != rows + 1 or offsets[0] != 0 or offsets[-1] != len(vectors) or vectors.ndim != 2:
                raise ValueError(f"{len(offsets) - 1} documents, {len(vectors)} vectors; the index has {rows}")
        except (OSError, ValueError, KeyError, TypeError, RetrError) as e:
            logger.warning("token vectors %s are damaged (%s): discarded, encoded again", folder, e)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return cls(vectors, offsets)

    @classmethod
    def of(cls, model: MultiVectorModel, docstore, corpus_sha256: str, ids: Sequence[str]) -> TokenStore:
        """The index's token vectors from the cache, or encoded now (every document once) and kept there."""
        folder = cache_home() / "multivector" / cls.key(model, corpus_sha256, ids)
        found = cls.load(folder, len(ids))
        if found is not None:
            return found
        texts = [docstore.get(row).full_text() for row in range(len(ids))]
        vectors, offsets = model.encode_documents(texts)
        with atomic_dir(folder) as tmp:
            np.save(tmp / "vectors.npy", vectors)
            np.save(tmp / "offsets.npy", offsets)
            write_json(tmp / "meta.json", {"model": model.ref.id, "model_hash": model.ref.hash, "documents": len(ids),
                                           "vectors": file_sha256(tmp / "vectors.npy"),
                                           "offsets": file_sha256(tmp / "offsets.npy"),
                                           "dim": int(vectors.shape[1]), "dtype": "float16"})
        logger.info("token vectors of %d documents kept in %s (%.1f per document, %s bytes)", len(ids), folder,
                    len(vectors) / max(1, len(ids)), f"{vectors.nbytes:,}")
        # mapped from the published file (not kept in memory); its checksums were just written from these bytes
        return cls(np.load(folder / "vectors.npy", mmap_mode="r", allow_pickle=False), offsets)

    def maxsim(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Each row's MaxSim with ``query`` (its token vectors): per query token the best document token, summed."""
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        tokens = np.concatenate([self.vectors[a:b] for a, b in zip(starts, ends, strict=True)]).astype(np.float32)
        sims = query @ tokens.T  # (query tokens, all candidates' tokens)
        bounds = np.concatenate([[0], np.cumsum(ends - starts)[:-1]])
        return np.maximum.reduceat(sims, bounds, axis=1).sum(axis=0)


class MaxSimRetriever:
    """Reranks the first stage's top ``depth`` by MaxSim (interpolated with the first stage's scores where
    ``weight`` < 1); the hits below keep their order, after them."""

    def __init__(self, first: Retriever, model: MultiVectorModel, store: TokenStore, positions: Mapping[str, int],
                 depth: int, weight: float, name: str):
        self.first, self.model, self.store, self.positions = first, model, store, positions
        self.depth, self.weight, self.name = depth, weight, name
        self.stages = tuple(dict.fromkeys(first.stages + ("maxsim",)))

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        first = self.first.search(queries, max(k, self.depth), timer)
        out: dict[str, list[Hit]] = {}
        with timer.stage("maxsim"):
            for qid, hits in first.items():
                head, tail = hits[: self.depth], hits[self.depth:]
                if not head:
                    out[qid] = []
                    continue
                rows = np.asarray([self.positions[h.doc_id] for h in head], dtype=np.int64)
                scores = self.store.maxsim(self.model.encode_query(queries[qid]), rows).astype(np.float32)
                out[qid] = rerank_head(head, tail, scores, self.weight)[:k]
        return Run(out)


def _build(ctx, node, inputs) -> MaxSimRetriever:
    name = getattr(ctx.config, "multivector_model", None)
    if not name:
        raise RetrError(f"pipeline {str(node)!r} needs a multi-vector encoder: pass --multivector-model MODEL")
    parts = ctx.parts
    model = parts.once(("multivector", name), lambda: MultiVectorModel(name))
    store = parts.once(("tokens", name), lambda: TokenStore.of(model, parts.docstore, parts.corpus_sha256,
                                                              parts.index.ids))
    return MaxSimRetriever(inputs[0], model, store, parts.positions, node.option("depth"), node.option("weight"),
                           str(node))


STAGE = Stage("maxsim", "step", _build, "late interaction: a multi-vector encoder (--multivector-model) rescores "
              "the top depth hits by MaxSim over the documents' token vectors (kept in the cache)",
              # weight: MaxSim's share against the first stage's scores, chosen on SciFact's dev split (81 queries carved
              # from train: hybrid 0.7490; weight 1.0 0.7341, 0.7 0.7485, 0.5 0.7508, 0.3 0.7535 nDCG@10)
              options={"depth": Option(100, int, low=1), "weight": Option(0.3, float, low=0.0, high=1.0)})
