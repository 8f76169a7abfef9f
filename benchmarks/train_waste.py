"""What padding and repeated tokenising could save in a bi-encoder epoch (issue 16's "no wasted padding, tokenise
once — measure each").

Takes the training examples `retr train bi-encoder` makes with its defaults (train split minus the dev queries,
one BM25-mined negative per pair, max length 256), tokenises them as the trainer's model does, and replays the
epoch's batching: GradCache mini-batches of 16 texts per column, each padded to its longest. Reports the share of
computed tokens that are padding (what length-grouped batches could save at most) and the time to tokenise the
epoch's texts once (what tokenising once could save at most), next to a measured epoch for scale.

    python benchmarks/train_waste.py [--dataset ../shared/datasets/scifact] [--epoch-seconds 369]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=str(Path(__file__).resolve().parents[1].parent / "shared/datasets/scifact"))
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--epoch-seconds", type=float, default=369.0,
                   help="a measured epoch's training steps, for scale (README: bf16, 256 tokens)")
    p.add_argument("--out", default="benchmarks/results/train-waste.json")
    args = p.parse_args(argv)

    from tokenizers import Tokenizer

    from retr.eval.data import load_dataset
    from retr.retrieval.models import bundled_model_path
    from retr.train.bi_encoder import BiEncoderTrainConfig
    from retr.train.data import labeled_pairs, split_dev
    from retr.train.negatives import mine_bm25_negatives, temporary_bm25

    cfg = BiEncoderTrainConfig()
    ds = load_dataset(args.dataset, "train", download=False)
    train_q, _ = split_dev(ds.qrels, cfg.dev_fraction, cfg.seed)
    pairs = labeled_pairs(ds.queries, ds.qrels, train_q)
    texts = [d.full_text() for d in ds.corpus.docs]
    doc_text = dict(zip(ds.corpus.ids, texts, strict=True))
    with temporary_bm25(ds.corpus.ids, texts) as bm25:
        negatives = mine_bm25_negatives(pairs, bm25, ds.qrels, 1, cfg.seed, depth=cfg.negative_depth)
    columns = {"queries": [p.query for p in pairs], "positives": [doc_text[p.positive_id] for p in pairs],
               "negatives": [doc_text[n[0]] for n in negatives]}

    tok = Tokenizer.from_file(str(bundled_model_path() / "tokenizer.json"))
    tok.enable_truncation(args.max_length)
    tok.no_padding()
    t0 = time.perf_counter()
    lengths = {name: [len(e.ids) for e in tok.encode_batch(col)] for name, col in columns.items()}
    tokenise_s = time.perf_counter() - t0

    order = list(range(len(pairs)))
    random.Random(cfg.seed).shuffle(order)
    result = {"pairs": len(pairs), "max_length": args.max_length, "mini_batch": cfg.mini_batch_size,
              "tokenise_once_s": tokenise_s, "epoch_seconds_for_scale": args.epoch_seconds, "columns": {}}
    real_all = padded_all = 0
    for name, lens in lengths.items():
        real = padded = 0
        for s in range(0, len(order), cfg.mini_batch_size):
            chunk = [lens[i] for i in order[s:s + cfg.mini_batch_size]]
            real += sum(chunk)
            padded += max(chunk) * len(chunk)
        real_all += real
        padded_all += padded
        result["columns"][name] = {"mean_tokens": real / len(lens), "at_max_length": sum(x == args.max_length
                                                                                          for x in lens) / len(lens),
                                   "padding_share": 1 - real / padded}
        print(f"{name:>9}: mean {real / len(lens):6.1f} tokens, {result['columns'][name]['at_max_length']:.0%} at "
              f"{args.max_length}, padding {1 - real / padded:.1%} of their computed tokens")
    result["padding_share"] = 1 - real_all / padded_all
    best = args.epoch_seconds * (1 - result["padding_share"]) - tokenise_s
    result["best_epoch_seconds"] = best
    print(f"padding: {result['padding_share']:.1%} of all computed tokens; tokenising the epoch once: "
          f"{tokenise_s:.2f} s. At most: {args.epoch_seconds:.0f} s -> {best:.0f} s per epoch (goal 240 s)")
    from common import write_result

    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
