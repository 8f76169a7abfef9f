"""The learned sparse part of an index folder: every document's sparse vector as one CSR matrix (rows = the
index's rows), in ``sparse/``: ``data.npy`` (float32), ``indices.npy`` (int32), ``indptr.npy`` (int64) and
``retr_sparse.json`` (the model and the matrix's shape). Checksummed, generation by generation, as every part."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError
from retr.retrieval.sparse import SparseEncoderModel

SPARSE_DIR = "sparse"
SPARSE_CONFIG = "retr_sparse.json"
_ARRAYS = ("data", "indices", "indptr")


def encode_sparse(encoder: SparseEncoderModel, texts: Sequence[str]) -> tuple[object, float]:
    """The CSR rows of ``texts`` and the seconds it took."""
    t0 = time.perf_counter()
    matrix = encoder.encode_documents(texts, show_progress=len(texts) > 1000)
    return matrix, time.perf_counter() - t0


def write_sparse(folder: Path, matrix, encoder: SparseEncoderModel, encode_seconds: float) -> dict:
    """Write ``matrix`` into ``folder`` (a new folder); return the manifest's ``sparse`` entry (without ``dir``)."""
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    matrix = matrix.tocsr()
    matrix.sort_indices()
    np.save(folder / "data.npy", matrix.data.astype(np.float32))
    np.save(folder / "indices.npy", matrix.indices.astype(np.int32))
    np.save(folder / "indptr.npy", matrix.indptr.astype(np.int64))
    rows, dim = matrix.shape
    (folder / SPARSE_CONFIG).write_text(json.dumps({"rows": rows, "dim": dim, "model": encoder.describe()}, indent=2))
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    seconds = encode_seconds + time.perf_counter() - t0
    return {"model": encoder.describe(), "dim": dim, "nnz": int(matrix.nnz),
            "mean_nnz_per_doc": matrix.nnz / rows if rows else 0.0, "encode_seconds": encode_seconds,
            "build_seconds": seconds, "bytes": size, "docs_per_second": rows / seconds if seconds > 0 else None}


def load_sparse(folder: Path, rows: int):
    """The CSR matrix stored in ``folder``, checked: ``rows`` rows, indices inside its dimension, rows in order."""
    import scipy.sparse as sp

    try:
        meta = json.loads((folder / SPARSE_CONFIG).read_text())
        data, indices, indptr = (np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in _ARRAYS)
        dim = int(meta["dim"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RetrError(f"{folder}: unreadable sparse part ({str(e)[:80]}): rebuild the index") from None
    if len(indptr) != rows + 1 or int(meta.get("rows", -1)) != rows:
        raise RetrError(f"{folder / 'indptr.npy'}: holds {len(indptr) - 1} rows, the index {rows}: rebuild the index")
    if indptr[0] != 0 or indptr[-1] != len(data) or len(indices) != len(data) or bool((np.diff(indptr) < 0).any()) \
            or (len(indices) and (int(indices.max()) >= dim or int(indices.min()) < 0)):
        raise RetrError(f"{folder}: its rows do not match their offsets or dimension {dim}: rebuild the index")
    return sp.csr_matrix((np.asarray(data), np.asarray(indices), np.asarray(indptr)), shape=(rows, dim))
