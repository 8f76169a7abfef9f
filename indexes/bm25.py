"""Build the BM25 part of an index folder with bm25s (sparse matrices, memory-mapped on load)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from retr.retrieval.bm25 import CONFIG, BM25Config, tokenize

_DEFAULT = BM25Config()


def build_bm25(texts: Sequence[str], folder: Path, cfg: BM25Config = _DEFAULT) -> dict:
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
