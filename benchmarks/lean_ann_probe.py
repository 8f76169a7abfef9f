"""A probe for issue 14's lean index (not yet an index kind of retr): IVF-PQ codes in RAM, the full vectors as fp16
re-scored from a memory-mapped file (FAISS IndexRefine + IndexScalarQuantizer fp16, loaded with
IO_FLAG_MMAP_IFC), over synthetic vectors made from SciFact embeddings as `benchmarks/speed.py` section 6 makes
them; recall@10 against exact search and single-thread QPS for a few shapes.

    python benchmarks/lean_ann_probe.py --n 200000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    import faiss
    from speed import synthetic_vectors

    from retr.eval.data import load_dataset
    from retr.indexes.build import corpus_embeddings
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dataset", default=str(Path(__file__).resolve().parents[2] / "shared/datasets/scifact"))
    ap.add_argument("--shapes", default="IVF1024,PQ32;OPQ32,IVF1024,PQ32")
    args = ap.parse_args(argv)
    ds = load_dataset(args.dataset, "test", download=False)
    enc = BiEncoder(EncoderConfig())
    base, _ = corpus_embeddings(enc, ds.corpus)
    xb = synthetic_vectors(np.asarray(base), args.n).astype(np.float32)
    xq = enc.encode_queries(list(ds.queries.values()))
    flat = faiss.IndexFlatIP(xb.shape[1])
    flat.add(xb)
    _, gt = flat.search(xq, 10)
    for shape in args.shapes.split(";"):
        t0 = time.time()
        coarse = faiss.index_factory(xb.shape[1], shape, faiss.METRIC_INNER_PRODUCT)
        coarse.train(xb[:100_000])
        refine = faiss.IndexScalarQuantizer(xb.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        index = faiss.IndexRefine(coarse, refine)
        index.add(xb)
        build = time.time() - t0
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "lean.faiss")
            faiss.write_index(index, path)
            lean = faiss.read_index(path, faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
            ivf = faiss.extract_index_ivf(faiss.downcast_index(lean).base_index)
            faiss.omp_set_num_threads(1)
            for nprobe in (8, 16, 32):
                for k_factor in (10, 20, 50):
                    ivf.nprobe = nprobe
                    params = faiss.IndexRefineSearchParameters(k_factor=k_factor)
                    for i in range(20):
                        lean.search(xq[i:i + 1], 10, params=params)
                    t1 = time.perf_counter()
                    found = [lean.search(xq[i:i + 1], 10, params=params)[1][0] for i in range(len(xq))]
                    qps = len(xq) / (time.perf_counter() - t1)
                    recall = np.mean([len(set(f) & set(g)) / 10 for f, g in zip(found, gt, strict=True)])
                    print(f"{shape:22} nprobe {nprobe:3} k_factor {k_factor:3}  recall@10 {recall:.3f}  "
                          f"QPS {qps:6.0f}  build {build:.0f} s", flush=True)
            faiss.omp_set_num_threads(2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
