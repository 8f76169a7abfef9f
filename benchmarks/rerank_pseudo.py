"""Does a cross-encoder help on a corpus, measured without judged queries? Pseudo-queries cut from the corpus.

For ``--queries`` documents of the corpus (seeded), a span of 6-14 words is cut out of the document's text and
becomes a query whose one relevant document is what is left of that document (the inverse cloze task). The
corpus with those documents shortened is indexed as the reranker check indexes it (``retr.eval.pseudo.pseudo_run``:
the unchanged documents' vectors from the original corpus's cache entry; the shortened ones encoded), its hybrid
retrieves each pseudo-query's top ``--depth``, and the cross-encoder rescores them: nDCG@10 at every
interpolation weight 0, 0.1 .. 1, as `rerank_budget.py --curve` reports for judged queries. The question it
answers: does the weight these curves pick on a collection follow the weight its judged queries would pick?
(The study behind the reranker check that `retr eval`, `retr search` and `retr serve` now run: retr.eval.pseudo.)

    python benchmarks/rerank_pseudo.py --dataset ../shared/datasets/npl --model BI --reranker CE
        --out benchmarks/results/rerank-pseudo-npl-CE.json
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--model", required=True, help="the first stage's bi-encoder")
    p.add_argument("--reranker", required=True, help="cross-encoder folder(s), comma-separated")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from common import command_line, write_result

    from retr.eval.data import load_dataset
    from retr.eval.pseudo import cut_queries, pseudo_run
    from retr.retrieval.artifacts import versions
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig, smoothed_best

    ds = load_dataset(args.dataset, "test", download=False)
    encoder = BiEncoder(EncoderConfig(model=args.model))
    cut = cut_queries(ds.corpus.docs, args.queries, args.seed)
    run = pseudo_run(ds.corpus, encoder, cut, max(10, args.depth))  # the vectors from the corpus's cache entry
    result = {"command": command_line(), "versions": versions(), "dataset": ds.name, "model": args.model,
              "queries": len(cut), "depth": args.depth, "seed": args.seed, "first_stage_ndcg@10": None,
              "target_in_head": float(np.mean([any(h.doc_id in run.qrels[q] for h in run.first[q][:args.depth])
                                                for q in run.queries])),
              "examples": [c.query for c in cut[:3]], "rerankers": {}}
    for name in args.reranker.split(","):
        rr = CrossEncoderReranker(RerankConfig(model=name, depth=args.depth))
        curve = run.curve(rr, args.depth)
        result["first_stage_ndcg@10"] = curve["0.0"]  # weight 0: the first stage's own order
        result["rerankers"][name] = {"stored_weight": rr.interpolation, "curve": curve,
                                     "smoothed_best": smoothed_best(curve)}
        print(f"{ds.name} {name}: first stage {curve['0.0']:.4f}; by weight "
              + " ".join(f"{w} {v:.4f}" for w, v in curve.items()) + f"; rule: {smoothed_best(curve)}", flush=True)
        write_result(args.out, result, say=False)
    write_result(args.out, result)
    return 0

if __name__ == "__main__":
    sys.exit(main())
