"""BM25 with bm25s (sparse matrices, memory-mapped on load) and an English Snowball stemmer."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from retr.retrieval.errors import RetrError
from retr.retrieval.protocol import StageTimer
from retr.retrieval.types import Hit, Run

logger = logging.getLogger(__name__)

BM25_DIR = "bm25"
CONFIG = "retr_bm25.json"


@dataclass(frozen=True)
class BM25Config:
    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"


@functools.lru_cache(maxsize=4)
def _stemmer(language: str | None):
    if not language:
        return None
    import Stemmer

    return Stemmer.Stemmer(language)


def tokenize(texts: Sequence[str], cfg: BM25Config, show_progress: bool = False) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(list(texts), stopwords=cfg.stopwords or [], stemmer=_stemmer(cfg.stemmer),
                          return_ids=False, show_progress=show_progress)


def build_bm25(texts: Sequence[str], folder: Path, cfg: BM25Config = BM25Config()) -> dict:
    """Index ``texts`` (positions are doc positions) into ``folder``; return build stats."""
    import bm25s

    t0 = time.perf_counter()
    tokens = tokenize(texts, cfg, show_progress=len(texts) > 10_000)
    model = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    model.index(tokens, show_progress=len(texts) > 10_000)
    folder.mkdir(parents=True, exist_ok=True)
    model.save(str(folder), show_progress=False)
    (folder / CONFIG).write_text(json.dumps(asdict(cfg), indent=2))
    seconds = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return {"params": asdict(cfg), "build_seconds": seconds, "bytes": size, "vocab_size": len(model.vocab_dict)}


class BM25Retriever:
    """Retriever protocol over a saved bm25s index; doc positions map to ``ids``."""

    name = "bm25"
    stages = ("bm25",)

    def __init__(self, folder: Path, ids: Sequence[str]):
        import bm25s

        cfg_path = folder / CONFIG
        if not cfg_path.is_file():
            raise RetrError(f"{cfg_path}: missing: the index has no BM25 part (rebuild with `retr index --bm25`)")
        self.cfg = BM25Config(**json.loads(cfg_path.read_text()))
        self.model = bm25s.BM25.load(str(folder), mmap=True, show_progress=False)
        self.ids = list(ids)
        self.vocab = self.model.vocab_dict
        n = int(self.model.scores["num_docs"])
        if n != len(self.ids):
            raise RetrError(f"{folder}: BM25 index holds {n} documents but the id list has {len(self.ids)}")

    def _query_tokens(self, texts: Sequence[str]) -> list[list[str]]:
        return [[t for t in toks if t in self.vocab] for toks in tokenize(texts, self.cfg)]

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        qids = list(queries)
        with timer.stage("bm25"):
            token_lists = self._query_tokens([queries[q] for q in qids])
            k_eff = min(k, len(self.ids))
            out: dict[str, list[Hit]] = {}
            nonempty = [i for i, t in enumerate(token_lists) if t]
            for i, t in enumerate(token_lists):
                if not t:
                    out[qids[i]] = []
            if nonempty and k_eff > 0:
                docs, scores = self.model.retrieve([token_lists[i] for i in nonempty], k=k_eff,
                                                   show_progress=False, n_threads=1)
                for row, i in enumerate(nonempty):
                    out[qids[i]] = [Hit(self.ids[d], s)
                                    for d, s in zip(docs[row].tolist(), scores[row].tolist(), strict=True) if s > 0]
        return Run({q: out[q] for q in qids})

