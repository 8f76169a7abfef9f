"""`retr train mlm | bi-encoder | cross-encoder | sparse-encoder`: train retr models from a BERT backbone."""

from __future__ import annotations

import argparse

from retr.cli import options
from retr.retrieval.focus import INPUT_FORMS
from retr.train.bi_encoder import BiEncoderTrainConfig
from retr.train.cross_encoder import CrossEncoderTrainConfig
from retr.train.mlm import MLMTrainConfig
from retr.train.multi_vector import MultiVectorTrainConfig
from retr.train.packing import PACKINGS
from retr.train.sparse_encoder import SPARSE_KINDS, SparseEncoderTrainConfig


def _add_common(t, cfg, base_help: str) -> None:
    """The options every trainer takes, with that trainer's defaults."""
    t.add_argument("--base", default=None, help=base_help)
    t.add_argument("--out", required=True, help="folder to write the trained model to (its checkpoints beside it)")
    t.add_argument("--epochs", type=options.positive_int, default=cfg.epochs, help="passes over the training data")
    t.add_argument("--batch-size", type=options.positive_int, default=cfg.batch_size,
                   help="training examples per optimizer step")
    t.add_argument("--lr", type=float, default=cfg.learning_rate,
                   help=f"peak learning rate (AdamW; linear warm-up over the first {cfg.warmup_ratio * 100:g}%% of the "
                        f"steps, then linear decay)")
    t.add_argument("--max-length", type=options.positive_int, default=cfg.max_length,
                   help="tokens of each text while training (recorded with the model)")
    t.add_argument("--seed", type=int, default=cfg.seed, help="seed of the data order, the dev split and the new weights")
    t.add_argument("--max-steps", type=int, default=cfg.max_steps,
                   help="stop after this many optimizer steps (-1: after --epochs)")
    t.add_argument("--resume", action="store_true", help="continue from the last checkpoint of --out")
    for kind, what in (("attention", "the attention probabilities"), ("hidden", "every other backbone layer")):
        default = getattr(cfg, f"{kind}_dropout")
        shown = "the base model's own" if default is None else default
        t.add_argument(f"--{kind}-dropout", type=float, default=default,
                       help=f"dropout on {what} while training (default: {shown})")


def _add_precision(t, cfg) -> None:
    t.add_argument("--precision", choices=("auto", "bf16", "fp32"), default=cfg.precision,
                   help="training arithmetic (auto: bf16 autocast where the CPU has native bf16)")


def _add_freeze(t, cfg) -> None:
    t.add_argument("--freeze-layers", type=options.nonnegative_int, default=cfg.freeze_layers,
                   help="train without the embeddings and the first N transformer layers (no backward through them)")


def _common(args) -> dict:
    return dict(base=args.base, epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                max_length=args.max_length, seed=args.seed, max_steps=args.max_steps,
                attention_dropout=args.attention_dropout, hidden_dropout=args.hidden_dropout)


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train retr models from a BERT backbone")
    tsub = p.add_subparsers(dest="trainer", required=True)

    bi = BiEncoderTrainConfig()
    t = tsub.add_parser("bi-encoder", help="contrastive bi-encoder (in-batch + BM25 hard negatives)")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="BEIR dataset with training qrels")
    src.add_argument("--corpus", help="unlabeled corpus (with --self-supervised)")
    t.add_argument("--split", default="train", help="--dataset: the split whose queries and qrels are trained on")
    t.add_argument("--self-supervised", action="store_true", help="pairs from the corpus: title->body, sentence->rest")
    t.add_argument("--mini-batch-size", type=options.positive_int, default=bi.mini_batch_size,
                   help="GradCache chunk (memory); below --batch-size the cached loss is used")
    t.add_argument("--num-negatives", type=int, default=bi.num_negatives,
                   help="hard negatives per pair (0: in-batch only)")
    t.add_argument("--negatives", choices=("bm25", "model"), default=bi.negatives,
                   help="mined from BM25's top 30, or from the model's own (--base: the model being trained)")
    t.add_argument("--dev-fraction", type=float, default=bi.dev_fraction,
                   help="training queries held out to pick the epoch")
    t.add_argument("--teacher", default=None,
                   help="cross-encoder folder whose scores of each pair's positive and negatives are distilled "
                        "into the bi-encoder (KL beside the contrastive loss; default: none)")
    t.add_argument("--teacher-weight", type=float, default=bi.teacher_weight, help="weight of the teacher's loss")
    _add_precision(t, bi)
    _add_freeze(t, bi)
    _add_common(t, bi, "BERT or sentence-transformers folder (default: bundled MiniLM)")
    t.set_defaults(run=run_bi_encoder)

    sp = SparseEncoderTrainConfig()
    t = tsub.add_parser("sparse-encoder", help="learned sparse encoder (CSR over a dense model, or SPLADE over an "
                                               "MLM head) for the splade stage")
    t.add_argument("--dataset", required=True, help="BEIR dataset with training qrels")
    t.add_argument("--split", default="train", help="the split whose queries and qrels are trained on")
    t.add_argument("--kind", choices=SPARSE_KINDS, default=sp.kind,
                   help="csr: a sparse auto-encoder over the base's pooled vector; splade: max-pooled MLM logits "
                        "over the vocabulary with FLOPS regularisation (the base's MLM head, or a new one)")
    t.add_argument("--active-dims", type=options.positive_int, default=sp.active_dims,
                   help="csr: non-zero dimensions kept per text")
    t.add_argument("--num-negatives", type=int, default=sp.num_negatives,
                   help="BM25 hard negatives per pair (0: in-batch only)")
    _add_precision(t, sp)
    _add_freeze(t, sp)
    _add_common(t, sp, "BERT or sentence-transformers folder (default: bundled MiniLM)")
    t.set_defaults(run=run_sparse_encoder)

    mv = MultiVectorTrainConfig()
    t = tsub.add_parser("multi-vector", help="late-interaction encoder (ColBERT-style token vectors, MaxSim) for "
                                             "the maxsim stage")
    t.add_argument("--dataset", required=True, help="BEIR dataset with training qrels")
    t.add_argument("--split", default="train", help="the split whose queries and qrels are trained on")
    t.add_argument("--dim", type=options.positive_int, default=mv.dim, help="each token vector's dimension")
    t.add_argument("--num-negatives", type=int, default=mv.num_negatives,
                   help="BM25 hard negatives per pair (0: in-batch only)")
    _add_precision(t, mv)
    _add_freeze(t, mv)
    _add_common(t, mv, "BERT or sentence-transformers folder (default: bundled MiniLM)")
    t.set_defaults(run=run_multi_vector)

    mlm = MLMTrainConfig()
    t = tsub.add_parser("mlm", help="domain-adaptive masked-language modelling (BERT's 80/10/10 rule; NSP optional)")
    t.add_argument("--corpus", required=True, help="BEIR folder or corpus file")
    t.add_argument("--whole-word", action="store_true", help="mask all word-pieces of a word together")
    t.add_argument("--mask-prob", type=float, default=mlm.mask_prob,
                   help="share of tokens chosen for prediction (default: the backbone's recipe: BERT 0.15, "
                        "ModernBERT 0.30)")
    t.add_argument("--replace", default=mlm.replace, metavar="MASK/SAME/RND",
                   help="what becomes of the chosen tokens, in %% as BERT's ablation writes it: [MASK] / kept the "
                        "same / a random token (default 80/10/10; its other rows: 100/0/0, 80/0/20, 80/20/0, "
                        "0/20/80, 0/0/100)")
    t.add_argument("--dev-fraction", type=float, default=mlm.dev_fraction,
                   help="documents held out for the dev MLM loss that picks the checkpoint")
    t.add_argument("--packing", choices=PACKINGS, default=mlm.packing,
                   help="an input: a document alone (cut at --max-length), two consecutive sentences "
                        "(pairs), or a run of sentences filling --max-length cut in two (segments)")
    t.add_argument("--nsp", action="store_true",
                   help="next-sentence prediction on [CLS] beside MLM: half the inputs' second segments come "
                        "from another document (needs --packing pairs or segments; BERT backbones)")
    _add_common(t, mlm, "BERT folder (default: bundled MiniLM; an MLM head is added)")
    t.set_defaults(run=run_mlm)

    ce = CrossEncoderTrainConfig()
    t = tsub.add_parser("cross-encoder", help="BERT + one-logit head, listwise over the first stage's negatives")
    t.add_argument("--first-stage-model", default=None,
                   help="bi-encoder of the hybrid first stage the negatives are mined from (default: bundled MiniLM)")
    t.add_argument("--dataset", required=True, help="BEIR dataset with training qrels")
    t.add_argument("--split", default="train", help="the split whose queries and qrels are trained on")
    t.add_argument("--num-negatives", type=options.positive_int, default=ce.num_negatives,
                   help="first-stage hard negatives per list")
    t.add_argument("--in-batch-negatives", type=options.positive_int, default=ce.in_batch_negatives,
                   help="other lists' documents per list")
    t.add_argument("--dev-fraction", type=float, default=ce.dev_fraction,
                   help="training queries held out (same split as the bi-encoder trainer with the same seed)")
    t.add_argument("--distill", type=float, default=ce.distill,
                   help="0 < w < 1: distil the first stage's ranking of each list into the targets (weight w; "
                        "ListNet loss, no in-batch negatives); 0: the judged positive alone")
    t.add_argument("--inputs", choices=tuple(INPUT_FORMS), default=ce.inputs,
                   help="what the model reads of a document: its head, or its first sentence and then the "
                        "sentences sharing most query terms, within --max-length (recorded with the model)")
    t.add_argument("--layers", type=options.nonnegative_int, default=ce.layers,
                   help="keep only the base's first N transformer layers (0: all): a smaller, faster reranker")
    t.add_argument("--teacher", default=None,
                   help="trained cross-encoder folder whose scores of each list are distilled into the targets "
                        "instead of the first stage's (weight --distill; default: none)")
    _add_precision(t, ce)
    _add_freeze(t, ce)
    _add_common(t, ce, "BERT folder (default: the bundled MiniLM + a new head)")
    t.add_argument("--no-graphs", dest="graphs", action="store_false",
                   help="do not make and time this machine's inference graphs of the new cross-encoder after "
                        "training (`retr doctor --rerank OUT --export` does it later; a search then takes the "
                        "openvino graph until they exist)")
    t.set_defaults(run=run_cross_encoder)


def run_mlm(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.indexes.corpus import load_corpus
    from retr.train.mlm import train_mlm
    from retr.train.runtime import require_training_stack

    require_training_stack()  # before the corpus is read
    cfg = MLMTrainConfig(**_common(args), mask_prob=args.mask_prob, whole_word=args.whole_word,
                         replace=args.replace, packing=args.packing, nsp=args.nsp,
                         dev_fraction=args.dev_fraction)
    m = train_mlm(Path(args.out), cfg, load_corpus(Path(args.corpus)), resume=args.resume)
    print(f"MLM-adapted BERT written to {args.out}: dev MLM loss {m['dev_mlm_loss_before']:.3f} -> "
          f"{m['dev_mlm_loss']:.3f} ({m['train_docs']} docs, {m['train_seconds']:.0f} s)")
    return 0


def run_cross_encoder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.eval.data import load_dataset
    from retr.train.cross_encoder import train_cross_encoder
    from retr.train.runtime import require_training_stack

    require_training_stack()  # before the dataset is read
    cfg = CrossEncoderTrainConfig(**_common(args), first_stage_model=args.first_stage_model,
                                  num_negatives=args.num_negatives, in_batch_negatives=args.in_batch_negatives,
                                  dev_fraction=args.dev_fraction, precision=args.precision, distill=args.distill,
                                  freeze_layers=args.freeze_layers, inputs=args.inputs,
                                  layers=args.layers, teacher=args.teacher)
    m = train_cross_encoder(Path(args.out), cfg, load_dataset(args.dataset, args.split), resume=args.resume)
    print(f"cross-encoder written to {args.out}: dev nDCG@10 first stage {m['dev_ndcg@10_first_stage']:.4f}, "
          f"reranked {m['dev_ndcg@10']:.4f} ({m['train_lists']} lists, {m['train_seconds']:.0f} s)")
    if args.graphs:  # the graphs a search will choose among on this machine, made now that torch is loaded
        from retr.cli.doctor_rerank import choose_now, make_graphs
        from retr.retrieval.rerank_model import DEFAULT_RERANK_DEPTH

        made, refused = make_graphs(args.out, DEFAULT_RERANK_DEPTH)
        choice = choose_now(args.out, DEFAULT_RERANK_DEPTH)
        print(f"graphs made for this machine: {', '.join(made) or 'none'}"
              + (f" (refused: {', '.join(refused)})" if refused else "")
              + (f"; reranking takes {choice.backend}: {choice.why}" if choice is not None else ""))
    return 0


def run_bi_encoder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.eval.data import load_dataset
    from retr.indexes.corpus import load_corpus
    from retr.retrieval.errors import RetrError
    from retr.train.bi_encoder import train_bi_encoder
    from retr.train.runtime import require_training_stack

    if args.self_supervised != bool(args.corpus):
        raise RetrError("use --corpus with --self-supervised, or --dataset for labeled training")
    require_training_stack()  # before the data is read
    cfg = BiEncoderTrainConfig(**_common(args), mini_batch_size=args.mini_batch_size,
                               num_negatives=args.num_negatives, negatives=args.negatives,
                               dev_fraction=args.dev_fraction, self_supervised=args.self_supervised,
                               precision=args.precision, teacher=args.teacher, teacher_weight=args.teacher_weight,
                               freeze_layers=args.freeze_layers)
    if args.dataset:
        m = train_bi_encoder(Path(args.out), cfg, dataset=load_dataset(args.dataset, args.split), resume=args.resume)
    else:
        m = train_bi_encoder(Path(args.out), cfg, corpus=load_corpus(Path(args.corpus)), resume=args.resume)
    print(f"bi-encoder written to {args.out}: dev nDCG@10 {m['dev_ndcg@10_before']:.4f} -> {m['dev_ndcg@10']:.4f} "
          f"({m['train_pairs']} pairs, {m['train_seconds']:.0f} s)")
    return 0


def run_multi_vector(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.eval.data import load_dataset
    from retr.train.multi_vector import train_multi_vector
    from retr.train.runtime import require_training_stack

    require_training_stack()
    cfg = MultiVectorTrainConfig(**_common(args), dim=args.dim, num_negatives=args.num_negatives,
                                 precision=args.precision, freeze_layers=args.freeze_layers)
    m = train_multi_vector(Path(args.out), cfg, dataset=load_dataset(args.dataset, args.split), resume=args.resume)
    print(f"multi-vector encoder written to {args.out}: dev nDCG@10 {m['dev_ndcg@10_before']:.4f} -> "
          f"{m['dev_ndcg@10']:.4f} ({m['train_pairs']} pairs, {m['train_seconds']:.0f} s)")
    return 0


def run_sparse_encoder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retr.eval.data import load_dataset
    from retr.train.runtime import require_training_stack
    from retr.train.sparse_encoder import train_sparse_encoder

    require_training_stack()
    cfg = SparseEncoderTrainConfig(**_common(args), kind=args.kind, active_dims=args.active_dims,
                                   num_negatives=args.num_negatives, precision=args.precision,
                                   freeze_layers=args.freeze_layers)
    m = train_sparse_encoder(Path(args.out), cfg, dataset=load_dataset(args.dataset, args.split), resume=args.resume)
    print(f"sparse encoder ({cfg.kind}) written to {args.out}: dev nDCG@10 {m['dev_ndcg@10_before']:.4f} -> "
          f"{m['dev_ndcg@10']:.4f} ({m['train_pairs']} pairs, {m['train_seconds']:.0f} s)")
    return 0
