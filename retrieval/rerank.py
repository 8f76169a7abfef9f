"""Cross-encoder reranking of a first stage's top ``depth`` documents."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError
from retr.retrieval.protocol import Retriever, StageTimer
from retr.retrieval.types import Hit, Run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RerankConfig:
    model: str
    depth: int = 100
    max_length: int = 256
    batch_size: int = 32
    device: str = "cpu"
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


def check_cross_encoder_dir(path: Path) -> None:
    """Refuse a folder that is not a one-logit sequence-classification model."""
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


class CrossEncoderReranker:
    """Scores (query, document) pairs with a sentence-transformers ``CrossEncoder``."""

    def __init__(self, config: RerankConfig):
        from sentence_transformers import CrossEncoder

        path = Path(config.model).expanduser()
        check_cross_encoder_dir(path)
        self.config = config
        self.path = path.resolve()
        self.model = CrossEncoder(str(self.path), max_length=config.max_length, device=config.device)
        self.interpolation = config.interpolation
        if self.interpolation is None:
            manifest = self.path / "retr_manifest.json"
            chosen = json.loads(manifest.read_text()).get("interpolation") if manifest.is_file() else None
            self.interpolation = float(chosen) if chosen is not None else 1.0

    def score(self, query: str, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float32)
        pairs = [(query, t) for t in texts]
        scores = self.model.predict(pairs, batch_size=self.config.batch_size, show_progress_bar=False,
                                    convert_to_numpy=True, activation_fn=None)
        return np.asarray(scores, dtype=np.float32).reshape(-1)

    def describe(self) -> dict:
        from retr.retrieval.encoder import hash_model_dir

        return {"path": str(self.path), "hash": hash_model_dir(self.path), "depth": self.config.depth,
                "max_length": self.config.max_length, "interpolation": self.interpolation}


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
