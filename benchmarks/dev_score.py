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
    from retr.train.bi_encoder import BiEncoderTrainConfig
    from retr.train.common import bm25_negatives, dev_ndcg, dev_split, embedding_scorer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--dataset", default=str(Path(__file__).resolve().parents[2] / "shared/datasets/scifact"))
    ap.add_argument("--max-length", type=int, default=256)
    args = ap.parse_args(argv)
    cfg = BiEncoderTrainConfig()
    ds = load_dataset(args.dataset, "train", download=False)
    dev = dev_split(ds.queries, ds.qrels, cfg.dev_fraction, cfg.seed)
    texts = [d.full_text() for d in ds.corpus.docs]
    _, candidates = bm25_negatives(ds.corpus, texts, [], None, dev, 0, cfg)
    score_all = embedding_scorer(dev.queries, candidates, dict(zip(ds.corpus.ids, texts, strict=True)), "fp32",
                                 normalize_embeddings=True)
    for path in args.models:
        model = SentenceTransformer(path, device="cpu")
        model.max_seq_length = args.max_length
        score = dev_ndcg(score_all(model), dev.qrels)
        print(f"{path}: dev nDCG@10 {score:.4f} at max length {args.max_length} ({len(dev.queries)} dev queries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
