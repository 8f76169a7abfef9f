"""The lean index kind at scale: recall@10 against exact search, single-thread QPS, memory kept in RAM, build time.

    python benchmarks/lean_ann.py --n 1000000 [--sweep 16:20,32:20,32:40,64:40] [--work /tmp/lean-ann]
                                  [--out benchmarks/results/lean-ann-1m.json]

Vectors are made from real SciFact embeddings as ``benchmarks/speed.py`` section 6 makes them (``synthetic_blocks``),
written block by block to a float32 .npy under ``--work`` (reused when it holds the same n), never held whole in
RAM; the 300 SciFact test queries are real. The exact top-10 comes from ``retr.indexes.dense.exact_topk`` (blockwise
over the memory-mapped vectors; checked against FAISS flat where flat fits: n <= 2M, which is also the peer timed
for QPS, one thread, in the same run). The lean index is built by retr's own ``build_faiss`` + ``save_dense`` in a
child process (its wall time and peak RSS), then opened by ``load_faiss`` as ``retr search`` opens it, in another
child: its RSS before and after opening (anonymous = what stays in RAM; file-backed = pages of the memory-mapped
fp16 vectors that were read, which the kernel may drop), and for each nprobe:k_factor the median QPS of 3 passes
over the queries one at a time on one thread (20 warm-up queries not timed), and recall@10.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

DATASET = Path(__file__).resolve().parents[2] / "shared/datasets/scifact"


def _rss_mb() -> dict:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out


def _queries_and_base():
    from retr.eval.data import load_dataset
    from retr.indexes.build import corpus_embeddings
    from retr.retrieval.encoder import BiEncoder, EncoderConfig

    ds = load_dataset(DATASET, "test", download=False)
    enc = BiEncoder(EncoderConfig())
    base, _ = corpus_embeddings(enc, ds.corpus)
    return np.asarray(base), enc.encode_queries(list(ds.queries.values()))


def make_vectors(base: np.ndarray, n: int, path: Path) -> np.ndarray:
    from speed import synthetic_blocks

    if path.is_file():
        vectors = np.load(path, mmap_mode="r")
        if vectors.shape == (n, base.shape[1]):
            return vectors
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, base.shape[1]))
    start = 0
    for block in synthetic_blocks(base, n):
        out[start:start + len(block)] = block
        start += len(block)
    out.flush()
    del out
    os.replace(tmp, path)
    return np.load(path, mmap_mode="r")


def child_build(vectors_path: str, folder: str, config: str) -> dict:
    from retr.indexes.dense import DenseIndexConfig, build_faiss, save_dense

    vectors = np.load(vectors_path, mmap_mode="r")
    cfg = DenseIndexConfig(**{"kind": "lean", **json.loads(config)})
    before = _rss_mb()
    t0 = time.perf_counter()
    index, params = build_faiss(vectors, cfg)
    build = time.perf_counter() - t0
    Path(folder).mkdir(parents=True, exist_ok=True)
    saved = save_dense(index, vectors, cfg.kind, Path(folder))
    return {"params": params, "saved": saved, "build_seconds": build, "rss_before_mb": before,
            "peak_rss_mb": _rss_mb()["VmHWM"]}  # its own address space's peak (rusage would keep the parent's)


def _timed_sweep(index, xq: np.ndarray, gt: np.ndarray, apply, settings: list, repeats: int = 3) -> list[dict]:
    import faiss
    from speed import single_query_qps

    faiss.omp_set_num_threads(1)
    rows = []
    for setting in settings:
        apply(setting)
        rows.append({"setting": setting, **single_query_qps(index, xq, gt, repeats)})
    return rows


def child_search(folder: str, queries_path: str, sweep: str) -> dict:
    from retr.indexes.dense import configure_search, load_faiss

    data = np.load(queries_path)
    xq, gt = data["xq"], data["gt"]
    info = json.loads((Path(folder) / "saved.json").read_text())
    before = _rss_mb()
    t0 = time.perf_counter()
    index = load_faiss(Path(folder), info["saved"])
    load_s = time.perf_counter() - t0
    after_load = _rss_mb()
    settings = [tuple(int(x) for x in s.split(":")) for s in sweep.split(",")]

    def apply(setting):
        configure_search(index, "lean", {"nprobe": setting[0], "k_factor": setting[1]})

    rows = _timed_sweep(index, xq, gt, apply, settings)
    for r in rows:
        r["nprobe"], r["k_factor"] = r.pop("setting")
    return {"load_seconds": load_s, "rss_before_mb": before, "rss_after_load_mb": after_load,
            "rss_after_search_mb": _rss_mb(), "rows": rows}


def _child(*args: str) -> dict:
    from common import run_child

    return run_child(__file__, args)


def main(argv: list[str] | None = None) -> int:
    import faiss

    from retr.indexes.dense import exact_topk

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--sweep", default="8:20,16:40,16:80,32:40,32:80,32:120,64:80",
                    help="nprobe:k_factor settings to time")
    ap.add_argument("--config", default="{}", help="extra DenseIndexConfig fields for the lean build, as JSON")
    ap.add_argument("--work", default="/tmp/lean-ann", help="where the vectors and the index are written")
    ap.add_argument("--reuse-index", action="store_true",
                    help="search the lean index a previous run left under --work (no rebuild; its build figures kept)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from common import command_line

    n = args.n
    work = Path(args.work)
    size = f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1000}k"
    out = Path(args.out or Path(__file__).parent / "results" / f"lean-ann-{size}.json")
    print("command:", command_line(), flush=True)

    base, xq = _queries_and_base()
    t0 = time.perf_counter()
    vectors = make_vectors(base, n, work / f"vectors-{n}.npy")
    make_s = time.perf_counter() - t0
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    _, gt = exact_topk(vectors, xq, 10)
    exact_s = time.perf_counter() - t0
    results: dict = {"n": n, "dim": int(vectors.shape[1]), "queries": len(xq), "cores": os.cpu_count(),
                     "cpu": platform.processor() or platform.machine(), "faiss": faiss.__version__,
                     "vectors_seconds": make_s, "exact_blockwise_seconds_all_queries": exact_s}
    print(f"{n:,} x {vectors.shape[1]} vectors ready in {make_s:.0f} s; exact top-10 of {len(xq)} queries "
          f"(blockwise) in {exact_s:.1f} s", flush=True)

    if n <= 2_000_000:  # FAISS flat in RAM as the reference and the peer
        flat = faiss.IndexFlatIP(vectors.shape[1])
        for start in range(0, n, 100_000):
            flat.add(np.asarray(vectors[start:start + 100_000]))
        _, gt_flat = flat.search(xq, 10)
        results["exact_equals_faiss_flat"] = bool((gt_flat == gt).all())
        flat_row = _timed_sweep(flat, xq[:50], gt[:50], lambda _: None, [None], repeats=1)[0]
        results["flat"] = {"qps": flat_row["qps"], "recall@10": flat_row["recall@10"], "queries_timed": 50,
                           "bytes_per_vector_in_ram": 4 * vectors.shape[1]}
        print(f"flat (1 thread): {flat_row['qps']:.1f} QPS; blockwise exact == FAISS flat: "
              f"{results['exact_equals_faiss_flat']}", flush=True)
        del flat
        faiss.omp_set_num_threads(os.cpu_count() or 1)

    folder = work / f"lean-{n}"
    if args.reuse_index and (folder / "saved.json").is_file():
        build = json.loads((folder / "saved.json").read_text())
    else:
        build = _child("build", str(vectors.filename), str(folder), args.config)
        (folder / "saved.json").write_text(json.dumps(build))
    print(f"lean build: {build['build_seconds']:.0f} s, peak RSS {build['peak_rss_mb']:.0f} MB, "
          f"params {build['params']}", flush=True)
    queries_path = work / f"queries-{n}.npz"
    np.savez(queries_path, xq=xq, gt=gt)
    search = _child("search", str(folder), str(queries_path), args.sweep)
    anon = search["rss_after_load_mb"]["RssAnon"] - search["rss_before_mb"]["RssAnon"]
    anon_after = search["rss_after_search_mb"]["RssAnon"] - search["rss_before_mb"]["RssAnon"]
    file_after = search["rss_after_search_mb"]["RssFile"] - search["rss_before_mb"]["RssFile"]
    saved = build["saved"]
    results["lean"] = {
        **build, **search,
        "resident_bytes_per_vector": saved["resident_bytes"] / n,
        "anon_rss_bytes_per_vector_after_load": anon * 2**20 / n,
        "anon_rss_bytes_per_vector_after_search": anon_after * 2**20 / n,
        "file_rss_mb_after_search": file_after,
        "disk_bytes_per_vector": saved["bytes"] / n,
    }
    print(f"lean: {saved['resident_bytes'] / n:.1f} bytes/vector in its RAM file; process anon RSS +{anon:.0f} MB "
          f"after open ({anon * 2**20 / n:.1f} B/vector), +{anon_after:.0f} MB after the sweep; file-backed "
          f"+{file_after:.0f} MB (fp16 pages read); {saved['bytes'] / n:.0f} bytes/vector on disk", flush=True)
    print(f"{'nprobe':>6} {'k_factor':>8} {'recall@10':>9} {'QPS':>8}  (1 thread, median of 3)")
    for r in search["rows"]:
        print(f"{r['nprobe']:>6} {r['k_factor']:>8} {r['recall@10']:>9.3f} {r['qps']:>8.0f}")
    if "flat" in results:
        best = max((r for r in search["rows"] if r["recall@10"] >= 0.95), key=lambda r: r["qps"], default=None)
        if best:
            results["best_at_recall_0.95"] = {**best, "qps_vs_flat": best["qps"] / results["flat"]["qps"]}
            print(f"fastest setting at recall@10 >= 0.95: nprobe {best['nprobe']} k_factor {best['k_factor']}: "
                  f"{best['qps']:.0f} QPS = {best['qps'] / results['flat']['qps']:.0f}x flat", flush=True)
    from common import write_result

    write_result(out, results)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(globals()[f"child_{sys.argv[2]}"](*sys.argv[3:])))
        sys.exit(0)
    sys.exit(main())
