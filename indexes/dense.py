"""FAISS indexes over normalised embeddings (inner product = cosine): flat, HNSW, IVF-PQ, and lean.

lean: 4-bit IVF-PQ fast-scan codes (32 bytes a vector at 384 dims) held in RAM, and the vectors themselves as
fp16 in a second file that is memory-mapped, never read whole: each query's ``k * k_factor`` best candidates by
code are re-scored from their fp16 vectors (FAISS IndexRefine)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval import defaults
from retr.retrieval.errors import RetrError
from retr.retrieval.mapped import MappedFile, attach
from retr.retrieval.types import check_int

logger = logging.getLogger(__name__)

KINDS = ("flat", "hnsw", "ivfpq", "lean")
FAISS_FILE = "dense.faiss"
REFINE_FILE = "refine.faiss"  # lean: the fp16 vectors its candidates are re-scored from (memory-mapped)
VECTORS_FILE = "vectors.npy"  # the full vectors, kept beside an index whose codes are lossy (IVF-PQ)
LOSSY_KINDS = ("ivfpq",)


@dataclass(frozen=True)
class DenseIndexConfig:
    kind: str = defaults.DENSE_KIND
    # HNSW
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 192  # the smallest measured to reach recall@10 0.95 at 1M vectors (M=32, efC=200)
    # IVF-PQ (0 = chosen from the corpus size)
    nlist: int = 0
    pq_m: int = 0
    pq_nbits: int = 8
    nprobe: int = 16
    # lean (nlist as above; 0 = chosen from the corpus size)
    lean_m: int = 0  # 4-bit sub-quantizers, lean_m / 2 bytes of code a vector (0: the largest even divisor of the
    # dimension up to 64, i.e. <= 32 bytes)
    lean_nprobe: int = 32
    k_factor: int = 80  # candidates re-scored from the fp16 vectors per hit asked for (1M: recall@10 0.960)
    train_sample: int = 100_000
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise RetrError(f"unknown index kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        for name, (least, most) in PARAMETER_BOUNDS.items():  # before FAISS sees them (M=-5 asks it for ~22 GB)
            check_int(getattr(self, name), f"{name} (--{name.replace('_', '-')})", least, most)
        if self.lean_m % 2:
            raise RetrError(f"--lean-m {self.lean_m}: must be an even number (two 4-bit codes a byte), or 0 for auto")


# every DenseIndexConfig number's range (0 where allowed: chosen from the corpus size), checked by the config itself
# so `retr index`, `retr eval` and retr.Index.build refuse alike; wide enough for any index FAISS builds in RAM
PARAMETER_BOUNDS = {
    "hnsw_m": (2, 256), "ef_construction": (1, 10_000), "ef_search": (1, 10_000),
    "nlist": (0, 1 << 20), "pq_m": (0, 4096), "pq_nbits": (1, 16), "nprobe": (1, 1 << 20),
    "lean_m": (0, 4096), "lean_nprobe": (1, 1 << 20), "k_factor": (1, 10_000),
    "train_sample": (1, 1 << 31), "seed": (0, (1 << 31) - 1),
}
MIN_POINTS_PER_CENTROID = 39  # FAISS k-means' own floor, below which it prints a warning to stderr


def _ivfpq_shape(n: int, dim: int, cfg: DenseIndexConfig) -> tuple[int, int, int]:
    """nlist ~ 4·sqrt(n) with >= 39 training points per list; pq_m divides dim; nbits fit n."""
    nlist = _nlist(n, cfg)
    if cfg.pq_m:
        if dim % cfg.pq_m:
            raise RetrError(f"--pq-m {cfg.pq_m} must divide the embedding dimension {dim}")
        pq_m = cfg.pq_m
    else:
        pq_m = next(m for m in (dim // 8, dim // 4, dim // 2, dim, 1) if m >= 1 and dim % m == 0)
    nbits = min(cfg.pq_nbits, max(1, int(math.log2(max(2, n // 39)))))
    return nlist, pq_m, nbits


BLOCK_ROWS = 65_536


def row_blocks(emb: np.ndarray, block_rows: int = BLOCK_ROWS):
    """``emb`` as contiguous float32 blocks of rows. Where ``emb`` is memory-mapped, the pages of each block are
    dropped from this process's resident set once the next is asked for (they stay in the page cache), so that
    reading a large file through never holds it in RSS besides the copy the caller builds."""
    for start in range(0, len(emb), block_rows):
        yield np.ascontiguousarray(emb[start:start + block_rows], dtype=np.float32)
        drop_pages(emb)


def drop_pages(emb: np.ndarray) -> None:
    """Drop the pages of a read-only memory-mapped ``emb`` from this process's resident set (a no-op for anything
    else; a writable mapping's pages could hold what was written to them)."""
    import mmap

    pages = getattr(emb, "_mmap", None) if isinstance(emb, np.memmap) and emb.mode == "r" else None
    if pages is not None and not pages.closed:
        pages.madvise(mmap.MADV_DONTNEED)


def _nlist(n: int, cfg: DenseIndexConfig) -> int:
    if cfg.nlist > n:
        raise RetrError(f"--nlist {cfg.nlist}: more lists than the {n} vectors to cluster; give at most {n}, or 0 "
                        f"to choose from the corpus size")
    return cfg.nlist or max(1, min(int(4 * math.sqrt(n)), n // MIN_POINTS_PER_CENTROID))


def _quiet(*clusterings) -> None:
    """Keep FAISS's k-means from printing to stderr (its warning for fewer than 39 points a centroid is written
    by the C++ code, past Python's logging); ``_train`` logs that case through retr's logger instead."""
    for cp in clusterings:
        cp.min_points_per_centroid = 1
        cp.verbose = False


def _warn_if_thin(points: int, centroids: int, what: str) -> None:
    if points < MIN_POINTS_PER_CENTROID * centroids:
        logger.warning("%s: %d training vectors for %d centroids (k-means wants >= %d per centroid); the lists may "
                       "be uneven", what, points, centroids, MIN_POINTS_PER_CENTROID)


def _train_sample(emb: np.ndarray, cfg: DenseIndexConfig, nlist: int) -> np.ndarray:
    """A seeded sample of >= 64 points per list (all of ``emb`` when smaller), in row order."""
    n = len(emb)
    n_train = max(cfg.train_sample, 64 * nlist)  # k-means wants >= 39 points per list
    if n <= n_train:
        return np.ascontiguousarray(emb, dtype=np.float32)
    rng = np.random.default_rng(cfg.seed)
    rows = np.sort(rng.choice(n, n_train, replace=False))
    # gathered block by block (a memory-mapped input is read through once, its pages let go as it goes)
    sample = np.empty((n_train, emb.shape[1]), dtype=np.float32)
    cuts = np.searchsorted(rows, np.arange(0, n + BLOCK_ROWS, BLOCK_ROWS))
    for b, block in enumerate(row_blocks(emb, BLOCK_ROWS)):
        sample[cuts[b]:cuts[b + 1]] = block[rows[cuts[b]:cuts[b + 1]] - b * BLOCK_ROWS]
    return sample


def _build_lean(emb: np.ndarray, cfg: DenseIndexConfig):
    """IVF-PQ fast-scan codes re-scored from fp16 vectors. Everything is built from the fp16-rounded vectors, the
    ones the index keeps: rebuilding from what the index holds (add/delete) gives what a fresh build gives."""
    import faiss

    n, dim = emb.shape
    if cfg.lean_m and dim % cfg.lean_m:
        raise RetrError(f"--lean-m {cfg.lean_m} must divide the embedding dimension {dim}")
    m = cfg.lean_m or max((m for m in range(2, min(64, dim) + 1, 2) if dim % m == 0), default=0)
    if not m:
        raise RetrError(f"the lean kind needs an even embedding dimension, this model gives {dim}")
    nlist = _nlist(n, cfg)
    refine = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)

    def rounded(x: np.ndarray) -> np.ndarray:  # what the fp16 part will hold, as FAISS rounds it
        x = np.ascontiguousarray(x, dtype=np.float32)
        return refine.sa_decode(refine.sa_encode(x)) if len(x) else x

    base = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(dim), dim, nlist, m, 4, faiss.METRIC_INNER_PRODUCT)
    base.cp.seed = cfg.seed
    base.pq.cp.seed = cfg.seed
    _quiet(base.cp, base.pq.cp)
    sample = rounded(_train_sample(emb, cfg, nlist))
    sampled = len(sample)
    _warn_if_thin(sampled, nlist, "--nlist")
    repeated = ""
    if sampled < 256:  # 16 centroids per sub-quantizer: a tiny corpus is repeated (k-means needs >= 16 points)
        sample = np.tile(sample, (-(-256 // max(1, len(sample))), 1))
        repeated = f", repeated to {len(sample)} rows"
    logger.info("training lean IVF%d,PQ%dx4fs on %d of %d vectors%s", nlist, m, sampled, n, repeated)
    base.train(sample)
    base.nprobe = min(cfg.lean_nprobe, nlist)
    index = faiss.IndexRefine(base, refine)
    index.k_factor = float(cfg.k_factor)
    for block in row_blocks(emb):
        index.add(rounded(block))
    return index, {"nlist": nlist, "lean_m": m, "pq_nbits": 4, "nprobe": base.nprobe,
                   "k_factor": cfg.k_factor, "refine": "fp16", "train_sample": sampled}


def build_faiss(emb: np.ndarray, cfg: DenseIndexConfig):
    import faiss

    if cfg.kind == "lean":
        return _build_lean(emb, cfg)
    n, dim = emb.shape
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
        sample = _train_sample(emb, cfg, nlist)
        index.cp.seed = cfg.seed
        index.pq.cp.seed = cfg.seed if hasattr(index.pq, "cp") else 0
        _quiet(index.cp, *([index.pq.cp] if hasattr(index.pq, "cp") else []))
        _warn_if_thin(len(sample), nlist, "--nlist")
        logger.info("training IVF%d,PQ%dx%d on %d of %d vectors", nlist, pq_m, nbits, len(sample), n)
        index.train(sample)
        index.nprobe = min(cfg.nprobe, nlist)
        params = {"nlist": nlist, "pq_m": pq_m, "pq_nbits": nbits, "nprobe": index.nprobe,
                  "train_sample": int(len(sample))}
    for block in row_blocks(emb):
        index.add(block)
    return index, params


def configure_search(index, kind: str, params: dict) -> None:
    import faiss

    if kind == "hnsw":
        faiss.downcast_index(index).hnsw.efSearch = int(params["efSearch"])
    elif kind in ("ivfpq", "lean"):
        faiss.extract_index_ivf(index).nprobe = int(params["nprobe"])
    if kind == "lean":
        faiss.downcast_index(index).k_factor = float(params["k_factor"])


def exact_topk(vectors: np.ndarray, q: np.ndarray, k: int,
               block_rows: int = BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-``k`` of ``q`` (nq, d) over ``vectors`` (n, d; may be a memory-mapped array of any
    float dtype), read ``block_rows`` at a time with a running top-k: memory is O(nq * (k + block_rows)), never
    O(n). Returns (scores, positions), each (nq, min(k, n)), best first; equal scores in position order."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    n = len(vectors)
    k = min(k, n)
    best_s = np.full((len(q), 0), -np.inf, dtype=np.float32)
    best_p = np.zeros((len(q), 0), dtype=np.int64)
    for start, block in zip(range(0, n, block_rows), row_blocks(vectors, block_rows), strict=True):
        s = np.concatenate([best_s, q @ block.T], axis=1)  # (nq, kept + rows)
        p = np.concatenate([best_p, np.broadcast_to(np.arange(start, start + len(block)), (len(q), len(block)))],
                           axis=1)
        if s.shape[1] > k:
            # keep every candidate tied with the k-th so that the position order below decides among them
            kth = np.partition(s, s.shape[1] - k, axis=1)[:, s.shape[1] - k:s.shape[1] - k + 1]
            keep = s >= kth
            width = int(keep.sum(axis=1).max())
            idx = np.argsort(~keep, axis=1, kind="stable")[:, :width]
            s, p = np.take_along_axis(s, idx, axis=1), np.take_along_axis(p, idx, axis=1)
            s = np.where(np.take_along_axis(keep, idx, axis=1), s, -np.inf)
        order = np.lexsort((p, -s), axis=1)[:, :k]
        best_s, best_p = np.take_along_axis(s, order, axis=1), np.take_along_axis(p, order, axis=1)
    return best_s, best_p


def save_dense(index, emb: np.ndarray, kind: str, folder: Path) -> dict:
    """Write ``index`` (and, for a lossy kind, the full vectors ``emb``) into ``folder``; the manifest's entries:
    the files, their bytes, and the bytes a search keeps in RAM (the rest is memory-mapped and read on demand)."""
    import faiss

    def write(part, name: str) -> None:  # FAISS's own failure to write (a full disk) as the OSError it is
        try:
            faiss.write_index(part, str(folder / name))
        except RuntimeError as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else "FAISS could not write it"
            raise OSError(f"{why[-160:]}") from None

    if kind == "lean":
        lean = faiss.downcast_index(index)
        write(lean.base_index, FAISS_FILE)
        write(lean.refine_index, REFINE_FILE)
        resident = (folder / FAISS_FILE).stat().st_size
        return {"file": FAISS_FILE, "refine_file": REFINE_FILE, "resident_bytes": resident,
                "bytes": resident + (folder / REFINE_FILE).stat().st_size}
    write(index, FAISS_FILE)
    out = {"file": FAISS_FILE, "bytes": (folder / FAISS_FILE).stat().st_size}
    if kind in LOSSY_KINDS:  # kept so that the index can change and compact
        np.save(folder / VECTORS_FILE, np.ascontiguousarray(emb, dtype=np.float32))
        out["vectors"] = VECTORS_FILE
    return out


def dense_files(info: dict) -> list[str]:
    """The files of a dense part, from its manifest entry."""
    return [info[key] for key in ("file", "refine_file", "vectors") if info.get(key)]


def _read(path: Path, flags: int):
    import faiss

    if not path.is_file():
        raise RetrError(f"{path}: missing from the index folder")
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as e:
        raise RetrError(f"{path}: not a readable FAISS index ({str(e).splitlines()[0][:120]})") from None


def load_faiss(folder: Path, info: dict):
    """The dense part of the index in ``folder``, read into RAM; a lean index's fp16 vectors memory-mapped."""
    import faiss

    if info.get("refine_file"):
        base = _read(folder / info["file"], 0)
        refine = _read(folder / info["refine_file"], faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
        if refine.ntotal != base.ntotal or refine.d != base.d:
            raise RetrError(f"{folder / info['refine_file']}: holds {refine.ntotal} x {refine.d}, its codes "
                            f"{base.ntotal} x {base.d}: rebuild the index")
        # the wrapper keeps both parts alive; the fp16 vectors are mapped: checked before each search (mapped.py)
        return attach(faiss.IndexRefine(base, refine), [MappedFile(folder / info["refine_file"])])
    # read into memory, IVF-PQ's lists too: its codes are small, and FAISS's IO_FLAG_MMAP mapping was read past
    # the end of a file cut short under a reader whose fstat check had passed (SIGBUS in the fault suite, after
    # other parts of an earlier copy of the folder were cut and restored in the same process)
    return _read(folder / info["file"], 0)


def live_vectors(folder: Path, info: dict, index) -> np.ndarray:
    """Every row's full vector: from the FAISS file where it holds them (flat, HNSW), else from the vectors kept
    beside it (IVF-PQ)."""
    if info["kind"] not in LOSSY_KINDS:
        return index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, index.d), dtype=np.float32)
    path = folder / info.get("vectors", VECTORS_FILE)
    if not path.is_file():
        raise RetrError(f"{path}: missing: this {info['kind']} index keeps only codes, so it cannot change; "
                        f"rebuild it with `retr index`")
    try:  # read whole, never mapped (a file cut short under a map is SIGBUS): its callers copy it anyway
        vectors = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise RetrError(f"{path}: unreadable ({e}): the index is damaged") from None
    if vectors.shape != (index.ntotal, index.d):
        raise RetrError(f"{path}: shape {vectors.shape}, the index holds {index.ntotal} x {index.d}: rebuild it")
    return vectors
