"""FAISS indexes over normalised embeddings (inner product = cosine): flat, HNSW, IVF-PQ."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

KINDS = ("flat", "hnsw", "ivfpq")
FAISS_FILE = "dense.faiss"
VECTORS_FILE = "vectors.npy"  # the full vectors, kept beside an index whose codes are lossy (IVF-PQ)
LOSSY_KINDS = ("ivfpq",)


@dataclass(frozen=True)
class DenseIndexConfig:
    kind: str = "flat"
    # HNSW
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 192  # the smallest measured to reach recall@10 0.95 at 1M vectors (M=32, efC=200)
    # IVF-PQ (0 = chosen from the corpus size)
    nlist: int = 0
    pq_m: int = 0
    pq_nbits: int = 8
    nprobe: int = 16
    train_sample: int = 100_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RetrError(f"unknown index kind {self.kind!r}: choose one of {', '.join(KINDS)}")


def _ivfpq_shape(n: int, dim: int, cfg: DenseIndexConfig) -> tuple[int, int, int]:
    """nlist ~ 4·sqrt(n) with >= 39 training points per list; pq_m divides dim; nbits fit n."""
    nlist = cfg.nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
    if cfg.pq_m:
        if dim % cfg.pq_m:
            raise RetrError(f"--pq-m {cfg.pq_m} must divide the embedding dimension {dim}")
        pq_m = cfg.pq_m
    else:
        pq_m = next(m for m in (dim // 8, dim // 4, dim // 2, dim, 1) if m >= 1 and dim % m == 0)
    nbits = min(cfg.pq_nbits, max(1, int(math.log2(max(2, n // 39)))))
    return nlist, pq_m, nbits


def build_faiss(emb: np.ndarray, cfg: DenseIndexConfig):
    import faiss

    n, dim = emb.shape
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    if cfg.kind == "flat":
        index = faiss.IndexFlatIP(dim)
        params = {}
    elif cfg.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.ef_construction
        index.hnsw.efSearch = cfg.ef_search
        params = {"M": cfg.hnsw_m, "efConstruction": cfg.ef_construction, "efSearch": cfg.ef_search}
    else:
        nlist, pq_m, nbits = _ivfpq_shape(n, dim, cfg)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(cfg.seed)
        n_train = max(cfg.train_sample, 64 * nlist)  # k-means wants >= 39 points per list
        sample = emb if n <= n_train else emb[np.sort(rng.choice(n, n_train, replace=False))]
        index.cp.seed = cfg.seed
        index.pq.cp.seed = cfg.seed if hasattr(index.pq, "cp") else 0
        logger.info("training IVF%d,PQ%dx%d on %d of %d vectors", nlist, pq_m, nbits, len(sample), n)
        index.train(sample)
        index.nprobe = min(cfg.nprobe, nlist)
        params = {"nlist": nlist, "pq_m": pq_m, "pq_nbits": nbits, "nprobe": index.nprobe,
                  "train_sample": int(len(sample))}
    index.add(emb)
    return index, params


def configure_search(index, kind: str, params: dict) -> None:
    import faiss

    if kind == "hnsw":
        faiss.downcast_index(index).hnsw.efSearch = int(params["efSearch"])
    elif kind == "ivfpq":
        faiss.extract_index_ivf(index).nprobe = int(params["nprobe"])


def save_faiss(index, path: Path) -> int:
    import faiss

    faiss.write_index(index, str(path))
    return path.stat().st_size


def load_faiss(path: Path, mmap: bool = True):
    import faiss

    if not path.is_file():
        raise RetrError(f"{path}: missing from the index folder")
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as e:
        raise RetrError(f"{path}: not a readable FAISS index ({str(e).splitlines()[0][:120]})") from None


def live_vectors(folder: Path, info: dict, index) -> np.ndarray:
    """Every row's full vector: from the FAISS file where it holds them (flat, HNSW), else from the vectors kept
    beside it (IVF-PQ)."""
    if info["kind"] not in LOSSY_KINDS:
        return index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, index.d), dtype=np.float32)
    path = folder / info.get("vectors", VECTORS_FILE)
    if not path.is_file():
        raise RetrError(f"{path}: missing: this {info['kind']} index keeps only codes, so it cannot change; "
                        f"rebuild it with `retr index`")
    vectors = np.load(path, mmap_mode="r")
    if vectors.shape != (index.ntotal, index.d):
        raise RetrError(f"{path}: shape {vectors.shape}, the index holds {index.ntotal} x {index.d}: rebuild it")
    return vectors
