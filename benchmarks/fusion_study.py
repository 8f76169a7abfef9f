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
ZERO_SHOT = ("npl", "cranfield", "cisi", "adi")
# stress checks, zero-shot only: one part made much weaker on purpose (~weakdense: the dense side reads only the
# first WEAK_TOKENS tokens of each text; ~weakbm25: BM25 indexes only the first WEAK_WORDS words of each document)
STRESS = tuple(f"{c}~{w}" for w in ("weakdense", "weakbm25") for c in ZERO_SHOT)
DEPTH = 100
WEAK_TOKENS = 16
WEAK_WORDS = 12


def _runs(name: str, root: Path, cache: Path):
    from dataclasses import replace

    from retr.eval.data import load_dataset
    from retr.indexes.build import IndexConfig, cached_index
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.compose import IndexParts
    from retr.retrieval.encoder import BiEncoder
    from retr.retrieval.types import Qrels, Run
    from retr.train.data import split_dev
    from retr.train.negatives import temporary_bm25

    base, _, variant = name.partition("~")
    dev = base == "scifact-dev"
    ds = load_dataset(str(root / ("scifact" if dev else base)), "train" if dev else "test", download=False)
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
    if variant == "weakdense":
        cfg = replace(cfg, encoder=replace(cfg.encoder, max_length=WEAK_TOKENS))
    encoder = BiEncoder(cfg.encoder)
    index = cached_index(ds.name, ds.corpus, encoder, cfg)
    parts = IndexParts(index, encoder)
    dense = parts.dense().search(queries, DEPTH)
    if variant == "weakbm25":
        texts = [" ".join(d.full_text().split()[:WEAK_WORDS]) for d in ds.corpus.docs]
        with temporary_bm25(ds.corpus.ids, texts) as weak:
            bm25 = weak.search(queries, DEPTH)
    else:
        bm25 = parts.bm25().search(queries, DEPTH)
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
    p.add_argument("--collections", default=",".join(COLLECTIONS + STRESS))
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
    plain = [n for n in names if n in ZERO_SHOT]
    stress = [n for n in names if "~" in n]
    w = max(12, *(len(n) + 1 for n in names))
    print(f"{'fusion':24}" + "".join(f"{n:>{w}}" for n in names))
    summary = {}
    for cname, row in table.items():
        print(f"{cname:24}" + "".join(f"{row[n]:{w}.4f}" for n in names))
        gap = {n: row[n] - max(table["bm25"][n], table["dense"][n]) for n in plain + stress}
        summary[cname] = {
            "scifact_dev": row.get("scifact-dev"),
            "worst_gap_zero_shot": min((gap[n] for n in plain), default=None),
            "worst_gap_stress": min((gap[n] for n in stress), default=None),
            "mean_zero_shot": float(np.mean([row[n] for n in plain])) if plain else None,
            "above_both_on_average": bool(plain) and float(np.mean([row[n] for n in plain])) > max(
                float(np.mean([table["bm25"][n] for n in plain])), float(np.mean([table["dense"][n] for n in plain]))),
        }
    print()
    print(f"{'fusion':24}{'scifact-dev':>12}{'worst gap (4 zero-shot)':>25}{'worst gap (stress)':>20}{'mean (4)':>10}")
    for cname, sm in summary.items():
        f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
        print(f"{cname:24}{f(sm['scifact_dev']):>12}{f(sm['worst_gap_zero_shot']):>25}{f(sm['worst_gap_stress']):>20}"
              f"{f(sm['mean_zero_shot']):>10}")
    from common import write_result

    write_result(args.out, {"ndcg@10": table, "summary": summary, "depth": DEPTH})
    return 0


if __name__ == "__main__":
    sys.exit(main())
