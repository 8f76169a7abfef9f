"""What int8 encoding costs a model's rankings, against bf16, side by side in one run.

    python benchmarks/int8_quality.py --model DIR [--dataset ../shared/datasets/scifact]
                                      [--out benchmarks/results/int8-quality-<model>.json]

Six `retr eval --pipelines dense,hybrid` runs of the same model, each in its own process: documents and queries
in bf16 (`--backend openvino --query-backend openvino`, the reference), the defaults (documents through the
model's static int8 graph, queries in bf16), feed-forward-only static int8 documents with bf16 queries, each
of the two int8 document graphs with the dynamic int8 ONNX query graph (full static int8 documents with int8
queries: the defaults before 2026-12-04), and bf16 documents with the dynamic int8 query graph (what a query takes
where the chooser finds it fastest). ``--only`` runs some of them beside bf16. For each: nDCG@10, its difference
to bf16 with its standard error, the paired t-test and randomization p over the queries (per dataset, and pooled
over several), and the ranking noise each graph adds on retr's fixed sample (the figure retr's check refuses a
graph on; skipped with ``--no-noise``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def configs() -> dict[str, tuple[str, str]]:
    """name: (document backend, query backend). The default backend's pair is named the defaults "where int8
    pays" (``runners.int8_pays``: int8 dot products and no AMX); elsewhere retr's default runs bf16 and this script
    forces int8 to measure it."""
    from retr.retrieval.backends.registry import DEFAULT_BACKEND, base_of

    pairs = [("openvino", "openvino"), ("openvino-int8", "openvino-int8"), ("openvino-int8-ffn", "openvino-int8-ffn"),
             ("openvino-int8-ffn", "onnx-int8"), ("openvino-int8", "onnx-int8"), ("openvino", "onnx-int8")]
    out = {}
    for docs, queries in pairs:
        name = f"{docs} documents, {'bf16' if base_of(queries).name == 'openvino' else queries} queries"
        if (docs, queries) == ("openvino", "openvino"):
            name = "bf16"
        elif (docs, queries) == (DEFAULT_BACKEND, DEFAULT_BACKEND):
            name = f"defaults where int8 pays ({name})"
        out[name] = (docs, queries)
    return out


def main(argv: list[str] | None = None) -> int:
    from common import command_line, run_measured

    from retr.eval.graph_noise import graph_noise

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", default=str(Path(__file__).resolve().parents[2] / "shared/datasets/scifact"),
                    help="one dataset, or several (comma-separated): then also their queries pooled")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, metavar="DOCS:QUERIES[,...]",
                    help="only these (document backend, query backend) pairs besides bf16, e.g. openvino:onnx-int8")
    ap.add_argument("--no-noise", action="store_true", help="skip the ranking noise of every graph (it makes them all)")
    args = ap.parse_args(argv)
    # int8's quality on any CPU, here and in the children (retr uses int8 only where the CPU has int8 dot products
    # and no AMX: runners.int8_pays)
    os.environ["RETR_INT8_DOT"] = "1"
    out = Path(args.out or Path(__file__).parent / "results" / f"int8-quality-{Path(args.model).name}.json")
    print("command:", command_line(), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="retr-int8-"))
    reports = {}  # configuration -> dataset -> report
    chosen = configs()
    if args.only:
        wanted = {tuple(pair.split(":")) for pair in args.only.split(",")}
        chosen = {name: pair for name, pair in chosen.items() if name == "bf16" or pair in wanted}
    for name, (docs, queries) in chosen.items():
        path = tmp / f"{len(reports)}.json"
        run_measured("retr", ["eval", "--dataset", args.dataset, "--no-download", "--model", args.model,
                              "--modes", "dense,hybrid", "--backend", docs, "--query-backend", queries,
                              "--out", str(path)], path.with_suffix(".log"))
        got = json.loads(path.read_text())
        reports[name] = {r["dataset"]["name"]: r for r in got.get("reports", [got])}
        print(f"{name}: done", flush=True)
    ref = reports["bf16"]
    names = list(ref)
    rows: dict = {}
    for name, by_dataset in reports.items():
        rows[name] = {"corpus_encoder": by_dataset[names[0]]["environment"]["corpus_encoder"],
                      "query_encoder": by_dataset[names[0]]["environment"]["query_encoder"]}
        for pipe in ("dense", "hybrid"):
            pooled_a, pooled_b = [], []
            for ds in names:
                per_ref, per = ref[ds]["pipelines"][pipe]["per_query"], by_dataset[ds]["pipelines"][pipe]["per_query"]
                qids = sorted(per_ref)
                a = [per_ref[q]["NDCG@10"] for q in qids]
                b = [per[q]["NDCG@10"] for q in qids]
                rows[name].setdefault(ds, {})[pipe] = _compare(a, b)
                pooled_a += a
                pooled_b += b
            if len(names) > 1:
                rows[name].setdefault("pooled", {})[pipe] = _compare(pooled_a, pooled_b)
    noise = {} if args.no_noise else graph_noise(args.model)
    for part in names + (["pooled"] if len(names) > 1 else []):
        n = sum(len(ref[ds]["pipelines"]["dense"]["per_query"]) for ds in (names if part == "pooled" else [part]))
        print(f"\n{part} ({n} queries) {'':30s} {'dense':>8s} {'diff':>8s} {'p':>6s} {'hybrid':>8s} {'diff':>8s} "
              f"{'p':>6s}")
        for name, r in rows.items():
            d, h = r[part]["dense"], r[part]["hybrid"]
            print(f"{name:50s} {d['ndcg@10']:8.4f} {d['diff']:+8.4f} {d['p_rand']:6.3f} "
                  f"{h['ndcg@10']:8.4f} {h['diff']:+8.4f} {h['p_rand']:6.3f}")
    print("ranking noise on retr's sample:", {k: round(v, 4) for k, v in noise.items()})
    from common import cpu, write_result

    write_result(out, {"model": args.model, "dataset": args.dataset, "cpu": cpu(), "configs": chosen,
                       "results": rows, "rank_noise": noise})
    return 0


def _compare(a: list[float], b: list[float]) -> dict:
    """``b`` against the reference ``a`` (per-query nDCG@10): means, the difference, its standard error and p."""
    import numpy as np

    from retr.eval.stats import paired_t_test, randomization_test

    d = np.asarray(b) - np.asarray(a)
    return {"queries": len(a), "ndcg@10": float(np.mean(b)), "diff": float(d.mean()),
            "stderr": float(d.std(ddof=1) / np.sqrt(len(d))), "p_t": paired_t_test(a, b)[1], "p_rand": randomization_test(a, b)}


if __name__ == "__main__":
    sys.exit(main())
