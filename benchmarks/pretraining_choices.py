"""Summarise the pretraining-choices study (docs/studies/pretraining-choices.md) from its `retr eval` reports.

The reports are named ``{arm}-{cell}-s{seed}-{dataset}.json`` in one folder (the study's commands write them so);
this reads their nDCG@10, gives each cell's mean and seed standard deviation per dataset, and runs retr's paired
tests (``retr.eval.compare``: paired t and randomization, Holm-corrected within each call) between the two cells
of each contrast, seed by seed, and between seeds of one cell (the seed noise):

    python benchmarks/pretraining_choices.py REPORTS_DIR --out benchmarks/results/pretraining-choices.json \
        [--commands COMMAND_LOG]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
from pathlib import Path

from retr.eval.compare import compare, systems_from

NAME = re.compile(r"^(?P<arm>[a-z]+)-(?P<cell>.+)-s(?P<seed>\d+)-(?P<dataset>[a-z]+)\.json$")
# (arm, baseline cell, other cell): the contrasts the study page reports
CONTRASTS = [
    ("frozen", "mask-80-10-10", "mask-100-0-0"),
    ("tuned", "mask-80-10-10", "mask-100-0-0"),
    ("bi", "pairs-nspoff", "pairs-nspon"),
    ("bi", "segments-nspoff", "segments-nspon"),
    ("ce", "pairs-nspoff", "pairs-nspon"),
    ("ce", "segments-nspoff", "segments-nspon"),
]


def _ndcg(report: Path, pipeline: str) -> float:
    return json.loads(report.read_text())["pipelines"][pipeline]["metrics"]["NDCG@10"]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def summarise(folder: Path) -> dict:
    files: dict[tuple[str, str, str], dict[int, Path]] = {}
    for f in sorted(folder.glob("*.json")):
        m = NAME.match(f.name)
        if m:
            files.setdefault((m["arm"], m["cell"], m["dataset"]), {})[int(m["seed"])] = f
    cells = {}
    for (arm, cell, dataset), by_seed in sorted(files.items()):
        pipeline = "bm25+rerank" if arm == "ce" else "dense"
        scores = {s: _ndcg(f, pipeline) for s, f in sorted(by_seed.items())}
        values = list(scores.values())
        entry = cells.setdefault(f"{arm}/{cell}", {})
        entry[dataset] = {"pipeline": pipeline, "ndcg@10_by_seed": scores, "mean": statistics.fmean(values),
                          "seed_sd": statistics.stdev(values) if len(values) > 1 else None}
        if arm == "ce":
            entry[dataset]["bm25"] = _ndcg(next(iter(by_seed.values())), "bm25")
    for f in sorted(folder.glob("base-*.json")):  # the bundled MiniLM itself, frozen
        cells.setdefault("frozen/minilm", {})[f.stem.split("-", 1)[1]] = {"pipeline": "dense",
                                                                          "ndcg@10": _ndcg(f, "dense")}
    contrasts = []
    for arm, base, other in CONTRASTS:
        datasets = sorted({d for (a, c, d) in files if a == arm and c in (base, other)})
        for d in datasets:
            a, b = files.get((arm, base, d), {}), files.get((arm, other, d), {})
            for seed in sorted(set(a) & set(b)):
                result = compare(systems_from([a[seed], b[seed]]), ["NDCG@10"])
                contrasts.append({"arm": arm, "dataset": d, "seed": seed, "baseline": base, "system": other,
                                  **_row(result)})
            seeds = sorted(a)
            for s1, s2 in zip(seeds, seeds[1:], strict=False):  # the seed noise of the baseline cell
                result = compare(systems_from([a[s1], a[s2]]), ["NDCG@10"])
                contrasts.append({"arm": arm, "dataset": d, "seed": f"{s1} vs {s2}", "baseline": base,
                                  "system": base, **_row(result)})
    return {"format": "retr-study", "study": "pretraining-choices", "cpu": _cpu(), "cells": cells,
            "paired_tests": contrasts}


def _row(result) -> dict:
    (r,) = result.metrics
    return {"queries": r.queries, "baseline_ndcg@10": r.baseline_mean, "system_ndcg@10": r.system_mean,
            "difference": r.difference, "p_t": r.p_t, "p_randomization": r.p_randomization,
            "wins_ties_losses": [r.wins, r.ties, r.losses]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commands", type=Path, default=None, help="the study's command log, kept in the results")
    args = ap.parse_args()
    result = summarise(args.reports)
    if args.commands:
        result["commands"] = args.commands.read_text().splitlines()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
