"""Build the BM25 part of an index folder with bm25s (sparse matrices, memory-mapped on load).

Beside bm25s's files the folder keeps each row's token ids and the vocabulary, so that a changed index
(``retr add``/``delete``) recomputes its statistics (idf, average length) over the live rows exactly, without
tokenising them again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from retr.retrieval.bm25 import CONFIG, TOKEN_OFFSETS, TOKEN_VOCAB, TOKENS, BM25Config, tokenizer_options
from retr.retrieval.errors import RetrError

_DEFAULT = BM25Config()


class RowTokens:
    """Token ids per row and the vocabulary they index."""

    def __init__(self, rows: list[list[int]], vocab: list[str]):
        self.rows = rows
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def of(cls, texts: Sequence[str], cfg: BM25Config) -> RowTokens:
        import bm25s

        tok = bm25s.tokenize(list(texts), **tokenizer_options(cfg), return_ids=True, show_progress=False)
        vocab = [""] * len(tok.vocab)
        for word, i in tok.vocab.items():
            vocab[i] = word
        return cls([list(r) for r in tok.ids], vocab)

    def select(self, keep: np.ndarray) -> RowTokens:
        """The rows ``keep`` (a boolean mask over rows), same vocabulary."""
        return RowTokens([r for r, k in zip(self.rows, keep.tolist(), strict=True) if k], self.vocab)

    def extend(self, other: RowTokens) -> RowTokens:
        """These rows, then ``other``'s, over the union of both vocabularies (this one's ids kept)."""
        vocab = list(self.vocab)
        index = {w: i for i, w in enumerate(vocab)}
        remap = []
        for w in other.vocab:
            if w not in index:
                index[w] = len(vocab)
                vocab.append(w)
            remap.append(index[w])
        return RowTokens(self.rows + [[remap[t] for t in r] for r in other.rows], vocab)

    def save(self, folder: Path) -> None:
        lengths = np.fromiter((len(r) for r in self.rows), dtype=np.int64, count=len(self.rows))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.fromiter((t for r in self.rows for t in r), dtype=np.int32, count=int(offsets[-1]))
        np.save(folder / TOKENS, flat)
        np.save(folder / TOKEN_OFFSETS, offsets)
        (folder / TOKEN_VOCAB).write_text(json.dumps(self.vocab, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> RowTokens | None:
        """The stored tokens of a BM25 folder, or None for a folder built before they were kept."""
        if not (folder / TOKENS).is_file():
            return None
        try:
            flat = np.load(folder / TOKENS)
            offsets = np.load(folder / TOKEN_OFFSETS)
            vocab = json.loads((folder / TOKEN_VOCAB).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise RetrError(f"{folder}: unreadable BM25 tokens ({e}): rebuild the index") from None
        if len(offsets) < 1 or offsets[-1] != len(flat) or (len(flat) and flat.max() >= len(vocab)):
            raise RetrError(f"{folder / TOKENS}: does not match its offsets or vocabulary: rebuild the index")
        flat_list = flat.tolist()
        bounds = offsets.tolist()
        return cls([flat_list[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)], vocab)


def index_bm25(tokens: RowTokens, cfg: BM25Config = _DEFAULT):
    """A bm25s model over ``tokens`` (its statistics: these rows')."""
    import bm25s

    if not tokens.vocab:  # bm25s would fail on its empty vocabulary (max() of nothing)
        raise RetrError(f"BM25 has no term to index: each of the {len(tokens)} documents is empty or holds only "
                        f"stopwords and one-letter words: index without BM25 (--no-bm25; bm25=False in the API)")
    model = bm25s.BM25(k1=cfg.k1, b=cfg.b, delta=cfg.delta, method=cfg.method)
    model.index((tokens.rows, {w: i for i, w in enumerate(tokens.vocab)}), show_progress=False)
    return model


def write_bm25(tokens: RowTokens, folder: Path, cfg: BM25Config = _DEFAULT, model=None) -> dict:
    """Index ``tokens`` (row i = document row i) into ``folder`` (``model``: already indexed); return build
    stats."""
    t0 = time.perf_counter()
    model = model if model is not None else index_bm25(tokens, cfg)
    return _save_bm25(model, tokens, folder, cfg, t0)


def bm25_rows(model, rows: np.ndarray):
    """The bm25s model of the documents ``rows`` (sorted) cut out of ``model``: every score stays what it is in
    the whole (a shard keeps the collection's idf and average length, not its own)."""
    import bm25s

    data, indices, indptr = (np.asarray(model.scores[k]) for k in ("data", "indices", "indptr"))
    local = np.full(int(model.scores["num_docs"]), -1, dtype=np.int64)
    local[rows] = np.arange(len(rows))
    kept = local[indices] >= 0
    column = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    counts = np.bincount(column[kept], minlength=len(indptr) - 1)
    part = bm25s.BM25(k1=model.k1, b=model.b, delta=model.delta, method=model.method, idf_method=model.idf_method,
                      dtype=model.dtype, int_dtype=model.int_dtype)
    part.scores = {"data": data[kept], "indices": local[indices[kept]].astype(indices.dtype),
                   "indptr": np.concatenate([[0], np.cumsum(counts)]).astype(indptr.dtype), "num_docs": len(rows)}
    part.vocab_dict = model.vocab_dict
    part.unique_token_ids_set = set(model.vocab_dict.values())
    part.nonoccurrence_array = getattr(model, "nonoccurrence_array", None)
    return part


def _save_bm25(model, tokens: RowTokens, folder: Path, cfg: BM25Config, t0: float) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    model.save(str(folder), show_progress=False)
    (folder / CONFIG).write_text(json.dumps(asdict(cfg), indent=2))
    tokens.save(folder)
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return {"params": asdict(cfg), "build_seconds": time.perf_counter() - t0, "bytes": size,
            "vocab_size": len(model.vocab_dict)}


def build_bm25(texts: Sequence[str], folder: Path, cfg: BM25Config = _DEFAULT) -> dict:
    """Tokenise and index ``texts`` (positions are rows) into ``folder``; return build stats."""
    t0 = time.perf_counter()
    stats = write_bm25(RowTokens.of(texts, cfg), folder, cfg)
    stats["build_seconds"] = time.perf_counter() - t0
    return stats
