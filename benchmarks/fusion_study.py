"""Which fusion holds on collections it has never seen: candidates chosen on SciFact's dev split, checked zero-shot.

For each collection, the BM25 and dense runs (depth 100, the hybrid's default fusion depth; the default index and
encoders) are computed once and kept under ``--runs`` (reused by later invocations); then every candidate fusion is
scored (nDCG@10) from the same two runs. SciFact's dev split is 20% of its *train* queries (seed 42): the only
judgements any choice may look at. npl, cranfield, cisi and adi are zero-shot checks; scifact test is reported.

    python benchmarks/fusion_study.py --datasets ../shared/datasets --out benchmarks/results/fusion-study.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

COLLECTIONS = ("scifact-dev", "scifact", "npl", "cranfield", "cisi", "adi")
DEPTH = 100


def _runs(name: str, root: Path, cache: Path):
    from retr.eval.data import load_dataset
    from retr.indexes.build import IndexConfig, cached_index
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import BiEncoder
    from retr.retrieval.pipeline import PipelineFactory
    from retr.retrieval.types import Qrels, Run
    from retr.train.data import split_dev

    dev = name == "scifact-dev"
    ds = load_dataset(str(root / ("scifact" if dev else name)), "train" if dev else "test", download=False)
    qrels = ds.qrels
    queries = {q: t for q, t in ds.queries.items() if q in qrels}
    if dev:
        _, dev_q = split_dev(qrels, 0.2, 42)
        queries = {q: queries[q] for q in dev_q}
        qrels = Qrels({q: dict(qrels[q]) for q in dev_q})
    path = cache / f"{name}.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        return (Run.from_dict(saved["bm25"]), Run.from_dict(saved["dense"]), qrels)
    cfg = IndexConfig(bm25=BM25Config())
    encoder = BiEncoder(cfg.encoder)
    index = cached_index(ds.name, ds.corpus, encoder, cfg)
    factory = PipelineFactory(index, encoder)
    bm25 = factory.bm25().search(queries, DEPTH)
    dense = factory.dense().search(queries, DEPTH)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bm25": bm25.to_dict(), "dense": dense.to_dict()}))
    return bm25, dense, qrels


def ndcg10(run, qrels) -> float:
    from retr.eval.metrics import evaluate

    return evaluate(run, qrels, (10,)).mean["NDCG@10"]


def candidates():
    """name -> fusion(bm25_run, dense_run) -> Run."""
    from retr.retrieval import fusion

    out = {"rrf": lambda b, d: fusion.rrf([b, d], 10)}
    for w in (0.3, 0.4, 0.5, 0.6, 0.7):
        out[f"minmax w_dense={w}"] = lambda b, d, w=w: fusion.minmax([b, d], 10, [1 - w, w])
    for w in (0.3, 0.5, 0.7):
        out[f"zscore w_dense={w}"] = lambda b, d, w=w: fusion.zscore([b, d], 10, [1 - w, w])
    for name in getattr(fusion, "ADAPTIVE", {}):
        out[name] = lambda b, d, name=name: fusion.ADAPTIVE[name]([b, d], 10)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets"))
    p.add_argument("--runs", default=str(Path.home() / ".cache/retr/fusion-study"), help="where the runs are kept")
    p.add_argument("--collections", default=",".join(COLLECTIONS))
    p.add_argument("--out", default="benchmarks/results/fusion-study.json")
    args = p.parse_args(argv)
    names = [c for c in args.collections.split(",") if c]
    data = {n: _runs(n, Path(args.datasets), Path(args.runs)) for n in names}
    table: dict[str, dict[str, float]] = {}
    for n, (b, d, q) in data.items():
        table.setdefault("bm25", {})[n] = ndcg10(b, q)
        table.setdefault("dense", {})[n] = ndcg10(d, q)
    for cname, fuse in candidates().items():
        for n, (b, d, q) in data.items():
            table.setdefault(cname, {})[n] = ndcg10(fuse(b, d), q)
    zero_shot = [n for n in names if n not in ("scifact-dev", "scifact")]
    print(f"{'fusion':32}" + "".join(f"{n:>12}" for n in names) + f"{'worst gap':>11}{'mean':>9}")
    summary = {}
    for cname, row in table.items():
        gaps = [row[n] - max(table["bm25"][n], table["dense"][n]) for n in zero_shot]
        mean = float(np.mean([row[n] for n in zero_shot])) if zero_shot else float("nan")
        summary[cname] = {"worst_gap_zero_shot": min(gaps) if gaps else None, "mean_zero_shot": mean}
        print(f"{cname:32}" + "".join(f"{row[n]:12.4f}" for n in names)
              + (f"{min(gaps):11.4f}" if gaps else " " * 11) + f"{mean:9.4f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"ndcg@10": table, "summary": summary, "depth": DEPTH}, indent=2) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
