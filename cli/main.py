"""The `retr` command line: thin argument parsing; each subcommand imports its work lazily.

``main(argv)`` returns the exit code, so tests call it in-process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

logger = logging.getLogger("retr")

# = retr.retrieval.encoder's BACKENDS and CROSS_ENCODER_BACKENDS (the CLI stays light)
BACKENDS = ("openvino-int8", "openvino", "onnx", "onnx-int8", "torch")
CROSS_ENCODER_BACKENDS = ("openvino", "onnx", "onnx-int8", "torch")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def _k_values(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: k values are comma-separated integers") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: k values must be >= 1")
    return ks


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="bi-encoder: a sentence-transformers folder or hub id (default: bundled all-MiniLM-L6-v2)")
    p.add_argument("--max-length", type=_positive_int, default=None, help="encoder max tokens (default: model's)")
    p.add_argument("--batch-size", type=_positive_int, default=32, help="texts per batch (torch backend)")
    p.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0],
                   help="bi-encoder inference: openvino-int8 (default: a corpus of 1000+ documents through static "
                        "int8 calibrated on it, other texts as openvino), OpenVINO (bf16 where the CPU has it), "
                        "ONNX Runtime fp32 or int8, or torch; every graph is checked against torch")


def _add_query_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--query-backend", choices=BACKENDS, default=None,
                   help="query encoding (default: onnx-int8 beside the openvino backends, else --backend): "
                        "a short query is bound by reading the weights, which int8 makes 4x smaller")


def _add_rerank_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rerank-depth", type=_positive_int, default=100)
    p.add_argument("--rerank-max-length", type=_positive_int, default=256)
    p.add_argument("--rerank-backend", choices=CROSS_ENCODER_BACKENDS, default=CROSS_ENCODER_BACKENDS[0],
                   help="cross-encoder inference")
    p.add_argument("--rerank-alpha", type=float, default=None,
                   help="cross-encoder weight vs the first stage (default: chosen on dev at training, else 1)")


def _add_index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=("flat", "hnsw", "ivfpq"), default="flat", help="FAISS index kind")
    p.add_argument("--hnsw-m", type=_positive_int, default=32)
    p.add_argument("--ef-construction", type=_positive_int, default=200)
    p.add_argument("--ef-search", type=_positive_int, default=192,
                   help="HNSW search breadth (192: recall@10 0.95 at 1M vectors, measured)")
    p.add_argument("--nlist", type=int, default=0, help="IVF lists (0: ~4*sqrt(N))")
    p.add_argument("--pq-m", type=int, default=0, help="PQ sub-quantizers (0: dim/8)")
    p.add_argument("--pq-nbits", type=_positive_int, default=8)
    p.add_argument("--nprobe", type=_positive_int, default=16)
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retr", description="Build, search and measure retrieval pipelines.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("index", help="embed a corpus into a FAISS index folder (+ BM25)")
    p.add_argument("--corpus", required=True, help="BEIR folder or corpus file (.jsonl, .csv, .tsv)")
    p.add_argument("--out", required=True, help="index folder to write (replaced atomically)")
    p.add_argument("--bm25", action="store_true", help="also build a BM25 index")
    p.add_argument("--id-field", default="_id")
    p.add_argument("--text-field", default="text")
    p.add_argument("--title-field", default="title", help="'' for none")
    _add_model_args(p)
    _add_index_args(p)

    p = sub.add_parser("search", help="query an index folder")
    p.add_argument("index", help="index folder written by `retr index`")
    p.add_argument("query")
    p.add_argument("-k", type=_positive_int, default=10)
    p.add_argument("--mode", choices=("dense", "bm25", "hybrid"), default="dense")
    p.add_argument("--fusion", choices=("rrf", "minmax"), default="rrf")
    p.add_argument("--rerank", default=None, metavar="MODEL_DIR", help="cross-encoder folder")
    _add_rerank_args(p)
    p.add_argument("--model", default=None, help="query encoder (default: the one that built the index)")
    p.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0])
    _add_query_backend_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("eval", help="BEIR metrics and latency for pipelines on a dataset")
    p.add_argument("--dataset", required=True, help="BEIR folder, or a name under $RETR_DATA (downloaded if online)")
    p.add_argument("--split", default="test")
    p.add_argument("--pipelines", default="bm25,dense,hybrid",
                   help="comma-separated: bm25, dense, hybrid, dense+rerank, hybrid+rerank, bm25+rerank")
    p.add_argument("--reranker", default=None, help="cross-encoder folder for +rerank pipelines")
    _add_rerank_args(p)
    p.add_argument("--fusion", choices=("rrf", "minmax"), default="rrf")
    p.add_argument("--fusion-depth", type=_positive_int, default=100)
    p.add_argument("--k-values", type=_k_values, default=(1, 3, 5, 10, 100, 1000))
    p.add_argument("--ignore-identical-ids", action="store_true",
                   help="drop hits whose doc id equals the query id (BEIR's ArguAna/Quora setting)")
    p.add_argument("--warmup", type=int, default=5, help="untimed queries before measuring")
    p.add_argument("--out", default=None, help="JSON report path")
    p.add_argument("--run-dir", default=None,
                   help="folder for one TREC run file per pipeline (default with --out: REPORT-runs/ beside it)")
    p.add_argument("--no-download", action="store_true", help="never download a dataset")
    _add_model_args(p)
    _add_query_backend_arg(p)
    _add_index_args(p)

    p = sub.add_parser("train", help="train retr models from a BERT backbone")
    tsub = p.add_subparsers(dest="trainer", required=True)
    t = tsub.add_parser("bi-encoder", help="contrastive bi-encoder (in-batch + BM25 hard negatives)")
    t.add_argument("--base", default=None, help="BERT or sentence-transformers folder (default: bundled MiniLM)")
    t.add_argument("--out", required=True)
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="BEIR dataset with training qrels")
    src.add_argument("--corpus", help="unlabeled corpus (with --self-supervised)")
    t.add_argument("--split", default="train")
    t.add_argument("--self-supervised", action="store_true", help="pairs from the corpus: title->body, sentence->rest")
    t.add_argument("--epochs", type=_positive_int, default=3, help="the checkpoint kept is the best epoch on dev")
    t.add_argument("--batch-size", type=_positive_int, default=16)
    t.add_argument("--mini-batch-size", type=_positive_int, default=16,
                   help="GradCache chunk (memory); below --batch-size the cached loss is used")
    t.add_argument("--lr", type=float, default=2e-5)
    t.add_argument("--max-length", type=_positive_int, default=256)
    t.add_argument("--num-negatives", type=int, default=1, help="BM25 hard negatives per pair (0: in-batch only)")
    t.add_argument("--dev-fraction", type=float, default=0.1, help="training queries held out to pick the epoch")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--max-steps", type=int, default=-1)
    t.add_argument("--resume", action="store_true", help="continue from the last checkpoint of --out")

    t = tsub.add_parser("mlm", help="domain-adaptive masked-language modelling (BERT's 80/10/10 rule)")
    t.add_argument("--corpus", required=True, help="BEIR folder or corpus file")
    t.add_argument("--base", default=None, help="BERT folder (default: bundled MiniLM; an MLM head is added)")
    t.add_argument("--out", required=True)
    t.add_argument("--whole-word", action="store_true", help="mask all word-pieces of a word together")
    t.add_argument("--mask-prob", type=float, default=0.15)
    t.add_argument("--epochs", type=_positive_int, default=1)
    t.add_argument("--batch-size", type=_positive_int, default=16)
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--max-length", type=_positive_int, default=256)
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--max-steps", type=int, default=-1)
    t.add_argument("--resume", action="store_true")

    t = tsub.add_parser("cross-encoder", help="BERT + one-logit head, listwise over the first stage's negatives")
    t.add_argument("--base", default=None, help="BERT folder (default: the bundled MiniLM + a new head)")
    t.add_argument("--first-stage-model", default=None, help="bi-encoder of the hybrid first stage to mine from")
    t.add_argument("--out", required=True)
    t.add_argument("--dataset", required=True)
    t.add_argument("--split", default="train")
    t.add_argument("--epochs", type=_positive_int, default=2)
    t.add_argument("--batch-size", type=_positive_int, default=8, help="lists per step")
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--max-length", type=_positive_int, default=256)
    t.add_argument("--num-negatives", type=_positive_int, default=7, help="first-stage hard negatives per list")
    t.add_argument("--in-batch-negatives", type=_positive_int, default=1, help="other lists' documents per list")
    t.add_argument("--dev-fraction", type=float, default=0.1,
                   help="training queries held out (same split as the bi-encoder trainer with the same seed)")
    t.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="training arithmetic (auto: bf16 autocast where the CPU has native bf16)")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--max-steps", type=int, default=-1)
    t.add_argument("--resume", action="store_true")
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (so in-process callers can redirect it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _setup_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[retr] %(levelname)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    # the CLI is the application: keep third-party chatter (weight-loading bars, info logs) off stderr,
    # without importing those libraries before they are needed
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _dense_config(args):
    from retr.indexes.dense import DenseIndexConfig

    return DenseIndexConfig(kind=args.kind, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction,
                            ef_search=args.ef_search, nlist=args.nlist, pq_m=args.pq_m, pq_nbits=args.pq_nbits,
                            nprobe=args.nprobe)


def cmd_index(args) -> int:
    from pathlib import Path

    from retr.eval.data import CorpusFormat, load_corpus
    from retr.indexes.build import IndexConfig, build_index
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig

    fmt = CorpusFormat(args.id_field, args.text_field, args.title_field or None)
    corpus = load_corpus(Path(args.corpus), fmt)
    cfg = IndexConfig(dense=_dense_config(args),
                      encoder=EncoderConfig(model=args.model, max_length=args.max_length, batch_size=args.batch_size,
                                            backend=args.backend),
                      bm25=BM25Config() if args.bm25 else None, use_cache=not args.no_cache)
    m = build_index(corpus, Path(args.out), cfg)
    d = m["dense"]
    print(f"indexed {m['num_docs']} documents into {args.out}: {d['kind']} {d['dim']}-d ({d['model']['id']}), "
          f"{d['docs_per_second']:.1f} docs/s{', + bm25' if m['bm25'] else ''}"
          f"{f', {corpus.empty_docs} empty' if corpus.empty_docs else ''}")
    return 0


def cmd_search(args) -> int:
    import json

    from retr.indexes.index import IndexFolder
    from retr.retrieval.pipeline import PipelineConfig, PipelineFactory, encoder_for_index
    from retr.retrieval.protocol import StageTimer
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    index = IndexFolder(args.index)
    encoder = encoder_for_index(index, args.model, backend=args.backend, query_backend=args.query_backend) \
        if args.mode in ("dense", "hybrid") else None
    reranker = (CrossEncoderReranker(RerankConfig(model=args.rerank, depth=args.rerank_depth,
                                                  max_length=args.rerank_max_length, backend=args.rerank_backend,
                                                  interpolation=args.rerank_alpha))
                if args.rerank else None)
    factory = PipelineFactory(index, encoder, reranker,
                              PipelineConfig(fusion=args.fusion, rerank_depth=args.rerank_depth))
    name = args.mode + ("+rerank" if reranker else "")
    retriever = factory.make(name)
    timer = StageTimer()
    hits = retriever.search({"q": args.query}, args.k, timer)["q"]
    positions = {d: i for i, d in enumerate(index.ids)}
    results = []
    for rank, h in enumerate(hits, start=1):
        doc = index.docstore.get(positions[h.doc_id])
        results.append({"rank": rank, "id": h.doc_id, "score": h.score, "title": doc.title, "text": doc.text})
    if args.json:
        print(json.dumps({"query": args.query, "pipeline": name, "k": args.k, "results": results,
                          "latency_ms": {s: v * 1000 for s, v in timer.seconds.items()}}, ensure_ascii=False))
        return 0
    if not results:
        print("no results")
    for r in results:
        snippet = " ".join(r["text"].split())
        snippet = snippet[:160] + ("…" if len(snippet) > 160 else "")
        title = f"  {r['title']}" if r["title"] else ""
        print(f"{r['rank']:>3}  {r['id']}  {r['score']:.4f}{title}\n     {snippet}")
    return 0


def cmd_eval(args) -> int:
    from pathlib import Path

    from retr.eval.data import load_dataset
    from retr.eval.runner import EvalConfig, run_eval, write_report
    from retr.eval.table import detail_table, main_table
    from retr.retrieval.bm25 import BM25Config
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.pipeline import PipelineConfig, parse_pipelines

    pipelines = tuple(parse_pipelines(args.pipelines))
    dataset = load_dataset(args.dataset, args.split, download=not args.no_download)
    cfg = EvalConfig(
        pipelines=pipelines, k_values=args.k_values,
        encoder=EncoderConfig(model=args.model, max_length=args.max_length, batch_size=args.batch_size,
                              backend=args.backend, query_backend=args.query_backend),
        dense=_dense_config(args), bm25=BM25Config(),
        pipeline=PipelineConfig(fusion=args.fusion, fusion_depth=args.fusion_depth, rerank_depth=args.rerank_depth),
        reranker=args.reranker, rerank_max_length=args.rerank_max_length, rerank_alpha=args.rerank_alpha,
        rerank_backend=args.rerank_backend,
        ignore_identical_ids=args.ignore_identical_ids, warmup=max(0, args.warmup), use_cache=not args.no_cache,
    )
    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is None and args.out:
        out = Path(args.out)
        run_dir = out.with_name(f"{out.stem}-runs")
    report = run_eval(dataset, cfg, run_dir)
    print(main_table(report))
    print()
    print(detail_table(report))
    if args.out:
        write_report(report, Path(args.out))
        print(f"\nreport written to {args.out}")
    return 0


def cmd_train(args) -> int:
    from pathlib import Path

    from retr.eval.data import load_corpus, load_dataset

    if args.trainer == "mlm":
        from retr.train.mlm import MLMTrainConfig, train_mlm

        cfg = MLMTrainConfig(base=args.base, epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                             max_length=args.max_length, mask_prob=args.mask_prob, whole_word=args.whole_word,
                             seed=args.seed, max_steps=args.max_steps)
        m = train_mlm(Path(args.out), cfg, load_corpus(Path(args.corpus)), resume=args.resume)
        print(f"MLM-adapted BERT written to {args.out}: dev MLM loss {m['dev_mlm_loss_before']:.3f} -> "
              f"{m['dev_mlm_loss']:.3f} ({m['train_docs']} docs, {m['train_seconds']:.0f} s)")
        return 0
    if args.trainer == "cross-encoder":
        from retr.train.cross_encoder import CrossEncoderTrainConfig, train_cross_encoder

        cfg = CrossEncoderTrainConfig(base=args.base, first_stage_model=args.first_stage_model, epochs=args.epochs,
                                      batch_size=args.batch_size, learning_rate=args.lr, max_length=args.max_length,
                                      num_negatives=args.num_negatives, in_batch_negatives=args.in_batch_negatives,
                                      dev_fraction=args.dev_fraction, precision=args.precision,
                                      seed=args.seed, max_steps=args.max_steps)
        m = train_cross_encoder(Path(args.out), cfg, load_dataset(args.dataset, args.split), resume=args.resume)
        print(f"cross-encoder written to {args.out}: dev nDCG@10 first stage {m['dev_ndcg@10_first_stage']:.4f}, "
              f"reranked {m['dev_ndcg@10']:.4f} ({m['train_lists']} lists, {m['train_seconds']:.0f} s)")
        return 0
    from retr.train.bi_encoder import BiEncoderTrainConfig, train_bi_encoder

    if args.self_supervised != bool(args.corpus):
        from retr.retrieval.errors import RetrError

        raise RetrError("use --corpus with --self-supervised, or --dataset for labeled training")
    cfg = BiEncoderTrainConfig(base=args.base, epochs=args.epochs, batch_size=args.batch_size,
                               mini_batch_size=args.mini_batch_size, learning_rate=args.lr,
                               max_length=args.max_length, num_negatives=args.num_negatives,
                               dev_fraction=args.dev_fraction, seed=args.seed,
                               self_supervised=args.self_supervised, max_steps=args.max_steps)
    if args.dataset:
        dataset = load_dataset(args.dataset, args.split)
        m = train_bi_encoder(Path(args.out), cfg, dataset=dataset, resume=args.resume)
    else:
        m = train_bi_encoder(Path(args.out), cfg, corpus=load_corpus(Path(args.corpus)), resume=args.resume)
    print(f"bi-encoder written to {args.out}: dev nDCG@10 {m['dev_ndcg@10_before']:.4f} -> {m['dev_ndcg@10']:.4f} "
          f"({m['train_pairs']} pairs, {m['train_seconds']:.0f} s)")
    return 0


COMMANDS = {"index": cmd_index, "search": cmd_search, "eval": cmd_eval, "train": cmd_train}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args)
    from retr.retrieval.errors import RetrError

    try:
        return COMMANDS[args.command](args)
    except RetrError as e:
        print(f"retr: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("retr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
