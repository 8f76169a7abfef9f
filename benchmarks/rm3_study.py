"""RM3 against BM25 on SciFact test and the four shared collections, from the BM25 part alone (no dense encode).

Each corpus gets a BM25 folder as `retr index` writes it (its default BM25 settings); every pipeline of ``--modes``
is built by retr's one builder (``retr.retrieval.compose.build``, the path of `retr search` and `retr eval`) and
searched to 1000 for every judged query. Reported per collection and pipeline: nDCG@10, MAP@1000, Recall@100 and
Recall@1000 (retr's scorer, pytrec_eval's definitions), and against ``bm25`` the per-query nDCG@10 wins / ties /
losses and a paired randomization test's p-value; and the seconds each pipeline took for all queries.

    RETR_DATA=/work/shared/datasets python benchmarks/rm3_study.py --out benchmarks/results/rm3-bm25-avx2-epyc.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("bm25,bm25+rm3,bm25+rm3(fb_docs=5),bm25+rm3(fb_docs=20),bm25+rm3(fb_terms=20),"
         "bm25+rm3(original_query_weight=0.7),fuse(bm25,bm25+rm3)")
METRICS = ("NDCG@10", "MAP@1000", "Recall@100", "Recall@1000")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="scifact,npl,cranfield,cisi,adi")
    ap.add_argument("--modes", default=MODES)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from common import command_line, write_result

    from retr.eval.data import load_dataset
    from retr.eval.metrics import evaluate
    from retr.eval.stats import randomization_test
    from retr.indexes.bm25 import build_bm25
    from retr.retrieval.artifacts import versions
    from retr.retrieval.backends.platform import this_platform
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.compose import IndexParts, build
    from retr.retrieval.pipeline import parse_pipelines

    pipelines = parse_pipelines(args.modes)
    results = {}
    for name in args.datasets.split(","):
        ds = load_dataset(name, "test", download=False)
        queries = {q: t for q, t in ds.queries.items() if q in ds.qrels}
        with tempfile.TemporaryDirectory(prefix="retr-rm3-") as tmp:
            folder = Path(tmp) / "bm25"
            build_bm25([d.full_text() for d in ds.corpus.docs], folder, BM25Config())
            parts = IndexParts(SimpleNamespace(bm25_folder=folder, ids=ds.corpus.ids))
            rows, base = {}, None
            for p in pipelines:
                t0 = time.perf_counter()
                run = build(p, parts).search(queries, 1000)
                seconds = time.perf_counter() - t0
                scored = evaluate(run, ds.qrels, [10, 100, 1000])
                ndcg = [scored.per_query[q]["NDCG@10"] for q in sorted(scored.per_query)]
                row = {m: scored.mean[m] for m in METRICS} | {"seconds": seconds, "queries": len(queries)}
                if base is None:
                    base = ndcg
                else:
                    diff = [b - a for a, b in zip(base, ndcg, strict=True)]
                    row |= {"wins": sum(d > 0 for d in diff), "ties": sum(d == 0 for d in diff),
                            "losses": sum(d < 0 for d in diff), "p_randomization": randomization_test(base, ndcg)}
                rows[str(p)] = row
                print(f"{name:10} {str(p):42} " + " ".join(f"{m} {row[m]:.4f}" for m in METRICS)
                      + (f"  w/t/l {row['wins']}/{row['ties']}/{row['losses']} p {row['p_randomization']:.3f}"
                         if "wins" in row else ""), flush=True)
        results[name] = {"docs": len(ds.corpus.docs), "queries": len(queries), "pipelines": rows}
    if args.out:
        write_result(args.out, {"header": {"command": command_line(), "versions": versions(),
                                           "cpu": this_platform().to_dict(),
                                           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                           "bm25": BM25Config().describe()},
                                "results": results})


if __name__ == "__main__":
    main()
