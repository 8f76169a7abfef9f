"""Check a `retr eval` report against BEIR's own EvaluateRetrieval on the run files it wrote.

    python benchmarks/check_beir.py REPORT.json

For every pipeline, reads its TREC run file, evaluates it with
``beir.retrieval.evaluation.EvaluateRetrieval.evaluate`` (pytrec_eval underneath) on the same
qrels, and compares each metric with the report, rounded as BEIR rounds (5 digits). Exits 1 on
any difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from beir.retrieval.evaluation import EvaluateRetrieval

    from retr.eval.data import load_dataset
    from retr.retrieval.types import Run

    report = json.loads(Path(argv[0]).read_text())
    ds = load_dataset(report["dataset"]["path"], report["dataset"]["split"], download=False)
    ks = report["k_values"]
    bad = 0
    for name, p in report["pipelines"].items():
        run = Run.read_trec(p["run_file"]).to_dict()
        ndcg, _map, recall, prec = EvaluateRetrieval.evaluate(ds.qrels.to_dict(), run, ks,
                                                              ignore_identical_ids=report["ignore_identical_ids"])
        mrr = EvaluateRetrieval.evaluate_custom(ds.qrels.to_dict(), run, [10], metric="mrr")
        beir = {**ndcg, **_map, **recall, **prec, **mrr}
        for metric, value in beir.items():
            ours = round(p["metrics"][metric], 5)
            status = "ok" if ours == value else "DIFF"
            bad += status != "ok"
            if status != "ok" or metric in ("NDCG@10", "Recall@100", "MRR@10"):
                print(f"{name:15s} {metric:12s} retr {ours:.5f}  beir {value:.5f}  {status}")
    print("all metrics equal BEIR's EvaluateRetrieval" if not bad else f"{bad} metric(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
