"""Dev nDCG@10 of bi-encoder folders on `retr train bi-encoder`'s own dev list, at one max length for all.

    python benchmarks/dev_score.py DIR [DIR ...] [--dataset ../shared/datasets/scifact] [--max-length 256]

The dev split carved from the training queries (same fraction and seed as the trainer's defaults) and each dev
query's BM25 top 10 plus its positives, as the trainer scores them: a model trained at a shorter length is scored
here at the length it will be used at.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from sentence_transformers import SentenceTransformer

    from retr.eval.data import load_dataset
    from retr.retrieval.types import Qrels
    from retr.train.bi_encoder import BiEncoderTrainConfig, _dev_candidates
    from retr.train.common import dev_ndcg
    from retr.train.data import split_dev
    from retr.train.negatives import temporary_bm25

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--dataset", default=str(Path(__file__).resolve().parents[2] / "shared/datasets/scifact"))
    ap.add_argument("--max-length", type=int, default=256)
    args = ap.parse_args(argv)
    cfg = BiEncoderTrainConfig()
    ds = load_dataset(args.dataset, "train", download=False)
    _, dev_q = split_dev(ds.qrels, cfg.dev_fraction, cfg.seed)
    queries = {q: ds.queries[q] for q in dev_q}
    qrels = Qrels({q: ds.qrels[q] for q in dev_q})
    texts = [d.full_text() for d in ds.corpus.docs]
    doc_text = dict(zip(ds.corpus.ids, texts, strict=True))
    with temporary_bm25(ds.corpus.ids, texts) as bm25:
        candidates = _dev_candidates(bm25, queries, qrels, cfg.dev_candidates)
    qids = list(queries)
    docs = sorted({d for q in qids for d in candidates[q]})
    pos = {d: i for i, d in enumerate(docs)}
    for path in args.models:
        model = SentenceTransformer(path, device="cpu")
        model.max_seq_length = args.max_length
        q_emb = model.encode([queries[q] for q in qids], normalize_embeddings=True)
        d_emb = model.encode([doc_text[d] for d in docs], normalize_embeddings=True, batch_size=32)
        score = dev_ndcg({q: {d: float(d_emb[pos[d]] @ q_emb[i]) for d in candidates[q]}
                          for i, q in enumerate(qids)}, qrels)
        print(f"{path}: dev nDCG@10 {score:.4f} at max length {args.max_length} ({len(qids)} dev queries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
