"""Does a cross-encoder help on a corpus, measured without judged queries? Pseudo-queries cut from the corpus.

For ``--queries`` documents of the corpus (seeded), a span of 6-14 words is cut out of the document's text and
becomes a query whose one relevant document is what is left of that document (the inverse cloze task). The
corpus with those documents shortened is indexed as `retr eval` indexes it (the embeddings of the unchanged
documents are reused from the cache entry of the original corpus; the shortened ones are encoded), its hybrid
retrieves each pseudo-query's top ``--depth``, and the cross-encoder rescores them: nDCG@10 at every
interpolation weight 0, 0.1 .. 1, as `rerank_budget.py --curve` reports for judged queries. The question it
answers: does the weight these curves pick on a collection follow the weight its judged queries would pick?
(The study behind the reranker check that `retr eval`, `retr search` and `retr serve` now run: retr.eval.pseudo.)

    python benchmarks/rerank_pseudo.py --dataset ../shared/datasets/npl --model BI --reranker CE
        --out benchmarks/results/rerank-pseudo-npl-CE.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

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
    from proc import command_line, write_result

    from retr.eval.data import load_dataset
    from retr.eval.metrics import evaluate
    from retr.eval.pseudo import cut_queries
    from retr.indexes.build import IndexConfig, cached_index, corpus_embeddings
    from retr.indexes.cache import EmbeddingCache, embedding_key
    from retr.indexes.corpus import load_corpus
    from retr.indexes.searcher import Searcher
    from retr.retrieval.artifacts import versions
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig, rerank_head, smoothed_best
    from retr.retrieval.types import Hit, Qrels, Run

    ds = load_dataset(args.dataset, "test", download=False)
    enc_cfg = EncoderConfig(model=args.model)
    encoder = BiEncoder(enc_cfg)
    cut = [(c.position, c.query, c.rest) for c in cut_queries(ds.corpus.docs, args.queries, args.seed)]
    short = {i: rest for i, _, rest in cut}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        with path.open("w") as fh:
            for i, d in enumerate(ds.corpus.docs):
                fh.write(json.dumps({"_id": d.doc_id, "title": d.title, "text": short.get(i, d.text)}) + "\n")
        corpus = load_corpus(path)
    # the unchanged documents' vectors from the original corpus's entry (encoded there, as `retr eval` would)
    base, _ = corpus_embeddings(encoder, ds.corpus)
    emb = np.array(base, dtype=np.float32)
    changed = sorted(short)
    emb[changed] = encoder.encode([corpus.docs[i].full_text() for i in changed])
    key = embedding_key(encoder.model_hash, corpus.sha256, encoder.max_length, encoder.corpus_graph_id,
                        encoder.prompts.document)
    EmbeddingCache().save(key, emb, {"model": encoder.model_id, "model_hash": encoder.model_hash,
                                     "backend": encoder.backend, "corpus_sha256": corpus.sha256,
                                     "max_length": encoder.max_length, "doc_prompt": encoder.prompts.document,
                                     "graph": None, "spliced_from": "the original corpus's entry"})
    folder = cached_index(f"{ds.name}-pseudo{args.seed}", corpus, encoder,
                          IndexConfig(encoder=enc_cfg, bm25=BM25Config())).folder
    qids = [f"p{j}" for j in range(len(cut))]
    queries = {q: c[1] for q, c in zip(qids, cut, strict=True)}
    qrels = Qrels({q: {corpus.docs[c[0]].doc_id: 1} for q, c in zip(qids, cut, strict=True)})
    searcher = Searcher(folder, enc_cfg)
    fetch = max(10, args.depth)
    first = dict(zip(qids, searcher.search_many([queries[q] for q in qids], fetch, "hybrid"), strict=True))
    searcher.close()
    full = {d.doc_id: d.full_text() for d in corpus.docs}
    hits = {q: [Hit(h.id, h.score) for h in first[q].hits] for q in qids}

    def ndcg(run: dict) -> float:
        return evaluate(Run(run), qrels, [10]).mean["NDCG@10"]

    result = {"command": command_line(), "versions": versions(), "dataset": ds.name, "model": args.model,
              "queries": len(qids), "depth": args.depth, "seed": args.seed,
              "first_stage_ndcg@10": ndcg({q: hits[q][:10] for q in qids}),
              "target_in_head": float(np.mean([any(h.doc_id in qrels[q] for h in hits[q][:args.depth])
                                                for q in qids])),
              "examples": [queries[q] for q in qids[:3]], "rerankers": {}}
    for name in args.reranker.split(","):
        rr = CrossEncoderReranker(RerankConfig(model=name, depth=args.depth))
        ce = {q: rr.score(queries[q], [full[h.doc_id] for h in hits[q][:args.depth]]) for q in qids}
        curve = {f"{w / 10:.1f}": ndcg({q: rerank_head(hits[q][:args.depth], hits[q][args.depth:], ce[q], w / 10)
                                        for q in qids}) for w in range(11)}
        result["rerankers"][name] = {"stored_weight": rr.interpolation, "curve": curve,
                                     "smoothed_best": smoothed_best(curve)}
        print(f"{ds.name} {name}: first stage {result['first_stage_ndcg@10']:.4f}; by weight "
              + " ".join(f"{w} {v:.4f}" for w, v in curve.items()) + f"; rule: {smoothed_best(curve)}", flush=True)
        write_result(args.out, result, say=False)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
