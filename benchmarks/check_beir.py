"""Re-score the TREC run files of a `retr eval` report with BEIR's EvaluateRetrieval and compare every number.

Usage: python benchmarks/check_beir.py report.json
"""

from __future__ import annotations

import sys


def main(path: str) -> int:
    from beir.retrieval.evaluation import EvaluateRetrieval

    from retr.eval.data import load_dataset
    from retr.eval.report import EvalReport
    from retr.eval.trec import read_trec

    report = EvalReport.read(path)
    ds = load_dataset(report.dataset.path, report.dataset.split, download=False)
    worst = 0.0
    for name, p in report.pipelines.items():
        if p.run_file is None:
            print(f"{name}: no run file in the report (run `retr eval` with --out)")
            return 1
        run = read_trec(p.run_file)
        ndcg, _map, rec, prec = EvaluateRetrieval.evaluate(ds.qrels.to_dict(), run.to_dict(), report.k_values,
                                                           ignore_identical_ids=report.ignore_identical_ids)
        for metric, value in {**ndcg, **_map, **rec, **prec}.items():
            diff = abs(round(p.metrics[metric], 5) - value)
            worst = max(worst, diff)
            if diff:
                print(f"{name} {metric}: retr {p.metrics[metric]:.5f} vs BEIR {value:.5f}")
    print(f"{len(report.pipelines)} pipelines checked against BEIR: largest difference {worst:g}")
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
