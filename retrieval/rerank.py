"""Cross-encoder reranking of a first stage's top ``depth`` documents."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.encoder import DEFAULT_CROSS_ENCODER_BACKEND
from retr.retrieval.errors import RetrError
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.types import Hit, Run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerankConfig:
    model: str
    depth: int = 100
    max_length: int = 256
    batch_size: int = 32  # torch backend: pairs per batch
    token_budget: int = 8192  # exported backends: padded tokens per batch (length-sorted)
    device: str = "cpu"
    backend: str = DEFAULT_CROSS_ENCODER_BACKEND  # openvino (bf16 where native), onnx, onnx-int8, torch
    # weight of the cross-encoder in the final score (1.0: cross-encoder alone); None: the value
    # chosen on dev by `retr train cross-encoder` (in the folder's retr_manifest.json), else 1.0
    interpolation: float | None = None


def interpolate(ce: np.ndarray, first: np.ndarray, alpha: float) -> np.ndarray:
    """alpha * minmax(ce) + (1 - alpha) * minmax(first), both over the reranked head."""
    def norm(x: np.ndarray) -> np.ndarray:
        span = float(x.max() - x.min()) if len(x) else 0.0
        return (x - x.min()) / span if span > 0 else np.ones_like(x)

    if alpha >= 1.0:
        return ce
    return alpha * norm(ce) + (1.0 - alpha) * norm(first)


def ce_logits(model, pairs: list[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
    """A sentence-transformers CrossEncoder's raw logits (its own default applies a sigmoid): the score every
    retr backend returns, so exported graphs, training dev scores and interpolation agree."""
    import torch

    scores = model.predict(pairs, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True,
                           activation_fn=torch.nn.Identity())
    return np.asarray(scores, dtype=np.float32).reshape(-1)


def check_cross_encoder_dir(path: Path) -> dict:
    """Refuse a folder that is not a one-logit sequence-classification model; return its config.json."""
    cfg_path = path / "config.json"
    if not path.is_dir():
        raise RetrError(f"{path}: no such cross-encoder folder")
    if not cfg_path.is_file():
        raise RetrError(f"{path}: not a cross-encoder folder (no config.json)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RetrError(f"{cfg_path}: unreadable ({e})") from None
    archs = cfg.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise RetrError(f"{path}: not a cross-encoder: its architectures are {archs or 'unset'}, "
                        f"expected a *ForSequenceClassification model (train one with `retr train cross-encoder`)")
    num_labels = len(cfg.get("id2label") or {0: "LABEL_0"})
    if num_labels != 1:
        raise RetrError(f"{path}: a classifier with {num_labels} labels, not a one-score cross-encoder")
    return cfg


class CrossEncoderReranker:
    """Scores (query, document) pairs with a sentence-transformers ``CrossEncoder``: through an exported,
    verified graph (OpenVINO / ONNX Runtime, cached like the bi-encoder's) or with torch."""

    def __init__(self, config: RerankConfig):
        from retr.retrieval.encoder import CROSS_ENCODER_BACKENDS, check_backend, hash_model_dir

        check_backend(config.backend, CROSS_ENCODER_BACKENDS)
        path = Path(config.model).expanduser()
        positions = check_cross_encoder_dir(path).get("max_position_embeddings")
        self.config = config
        self.path = path.resolve()
        self.model_hash = hash_model_dir(self.path)
        self.max_length = min(config.max_length, int(positions)) if positions else config.max_length
        self._model = None
        self._graph = None
        self._pair_ids = None
        self.backend = "torch"
        self.precision = "fp32"
        if config.backend != "torch" and config.device == "cpu":
            self._load_graph(config.backend)
        self.interpolation = config.interpolation
        if self.interpolation is None:
            manifest = self.path / "retr_manifest.json"
            chosen = json.loads(manifest.read_text()).get("interpolation") if manifest.is_file() else None
            self.interpolation = float(chosen) if chosen is not None else 1.0

    @property
    def model(self):
        """The torch CrossEncoder, loaded on first use."""
        if self._model is None:
            from sentence_transformers import CrossEncoder

            self._model = CrossEncoder(str(self.path), max_length=self.max_length, device=self.config.device)
        return self._model

    def _load_graph(self, variant: str) -> None:
        from retr.indexes.cache import cache_home
        from retr.retrieval import onnx_backend as ob

        self._pair_ids = ob.fast_pair_tokenizer(self.path, self.max_length)
        graph = ob.open_graph(lambda: self.model, self.model_hash, variant, self.max_length, cache_home(), kind="ce",
                              use_cache_alone=self._pair_ids is not None)
        if graph is None:
            return
        self._graph = graph
        self.backend, self.precision = graph.variant, graph.precision
        if self._pair_ids is None:
            self._pair_ids = self._hf_pair_ids

    def _hf_pair_ids(self, query: str, texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        enc = self.model.tokenizer([(query, t) for t in texts], truncation=True, max_length=self.max_length,
                                   padding=False, return_token_type_ids=True)
        return enc["input_ids"], enc["token_type_ids"]

    def _score_graph(self, query: str, texts: list[str]) -> np.ndarray:
        from retr.retrieval.onnx_backend import length_batches, padded

        ids, types = self._pair_ids(query, texts)
        lengths = np.fromiter((len(t) for t in ids), dtype=np.int64, count=len(ids))
        out = np.empty(len(texts), dtype=np.float32)
        runner = self._graph.session
        # one query's pairs split over the runner's parallel streams (OpenVINO: one per core)
        budget = min(self.config.token_budget, -(-int(lengths.sum()) // runner.parallel))
        feeds = ((idx, {"input_ids": padded(ids, idx, width, lengths), "attention_mask": mask,
                        "token_type_ids": padded(types, idx, width, lengths)})
                 for idx, width, mask in length_batches(lengths, budget))
        for idx, scores in runner.run_batches(feeds):
            out[idx] = scores.reshape(-1)
        return out

    def score(self, query: str, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float32)
        if self._graph is not None:
            return self._score_graph(query, texts)
        return ce_logits(self.model, [(query, t) for t in texts], self.config.batch_size)

    def describe(self) -> dict:
        return {"path": str(self.path), "hash": self.model_hash, "depth": self.config.depth,
                "max_length": self.max_length, "interpolation": self.interpolation, "backend": self.backend,
                "precision": self.precision}


class RerankRetriever:
    """Reranks the first stage's top ``depth``; hits below it keep their order, after them."""

    def __init__(self, first: Retriever, reranker: CrossEncoderReranker, docstore, positions: Mapping[str, int],
                 depth: int | None = None):
        self.first = first
        self.reranker = reranker
        self.docstore = docstore
        self.positions = positions
        self.depth = depth or reranker.config.depth
        self.name = f"{first.name}+rerank"
        self.stages = tuple(dict.fromkeys(first.stages + ("rerank",)))

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        first = self.first.search(queries, max(k, self.depth), timer)
        out: dict[str, list[Hit]] = {}
        with timer.stage("rerank"):
            for qid, hits in first.items():
                head, tail = hits[: self.depth], hits[self.depth:]
                texts = [self.docstore.get(self.positions[h.doc_id]).full_text() for h in head]
                scores = interpolate(self.reranker.score(queries[qid], texts),
                                     np.fromiter((h.score for h in head), dtype=np.float32, count=len(head)),
                                     self.reranker.interpolation)
                order = np.argsort(-scores, kind="stable")
                ranked = [Hit(head[i].doc_id, float(scores[i])) for i in order]
                floor = float(scores.min()) if len(scores) else 0.0
                ranked += [Hit(h.doc_id, floor - 1.0 - j) for j, h in enumerate(tail)]
                out[qid] = ranked[:k]
        return Run(out)
