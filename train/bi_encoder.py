"""`retr train bi-encoder`: contrastive training from a BERT backbone or a sentence-transformers model.

In-batch negatives plus BM25 hard negatives (guarded against false negatives) with
sentence-transformers' cached MNRL loss (GradCache: a large batch in small memory), a batch sampler
that never puts one text twice in a batch, a dev split carved from the training queries to pick
the checkpoint by dev nDCG@10, and `--resume` from the last checkpoint.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from retr.eval.data import Dataset
from retr.indexes.corpus import Corpus
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Qrels, check_float
from retr.train.common import (
    TrainConfig,
    bm25_negatives,
    dev_evaluator,
    dev_split,
    embedding_scorer,
    fit,
    freeze_bottom,
    pair_columns,
    resolve_precision,
    transformer_kwargs,
    write_output,
)
from retr.train.data import pairs_digest, self_supervised_pairs
from retr.train.runtime import training_run
from retr.train.teacher import teacher_record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BiEncoderTrainConfig(TrainConfig):
    epochs: int = 3
    learning_rate: float = 2e-5
    mini_batch_size: int = 16  # GradCache chunk: memory is set by this, not by batch_size
    num_negatives: int = 1
    # where the hard negatives come from: "bm25", or "model": the model being trained, from its own top
    # ``negative_depth`` before its first step (``mine_model_negatives``)
    negatives: str = "bm25"
    negative_depth: int = 30
    scale: float = 20.0  # 1 / temperature
    dev_fraction: float = 0.1
    dev_candidates: int = 10  # BM25 candidates per dev query (plus its positives) for dev nDCG@10
    self_supervised: bool = False
    precision: str = "auto"  # bf16 autocast where the CPU has native bf16, else fp32 (README, Training)
    # a cross-encoder folder: its logits over each pair's [positive, negatives] are distilled into the bi-encoder
    # beside the contrastive loss (KL, ``teacher_weight``); needs labeled data and at least one negative. The
    # whole batch is computed at once (no GradCache: ``mini_batch_size`` does not bound its memory)
    teacher: str | None = None
    teacher_weight: float = 1.0
    # no dropout on the attention probabilities: with it, torch's CPU attention leaves its fused kernel for a
    # masked softmax, a random mask and a multiply on every (batch, head, L, L) tensor. One SciFact epoch (fp32,
    # AVX2): trainer 348 s against 726 s in the same session, dev nDCG@10 0.8375 against 0.8330 (README, Training)
    attention_dropout: float | None = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.teacher is not None and (self.self_supervised or self.num_negatives < 1):
            raise RetrError("--teacher needs labeled training (--dataset) and --num-negatives >= 1")
        check_float(self.teacher_weight, "--teacher-weight", 0.0, 1000.0)
        check_float(self.dev_fraction, "--dev-fraction", 0.0, 1.0, open_high=True)
        if self.negatives not in ("bm25", "model"):
            raise RetrError(f"--negatives {self.negatives!r}: choose bm25 or model")


def load_st_model(cfg: TrainConfig, precision: str):
    """A SentenceTransformer from ``cfg.base`` at ``cfg.max_length``, loaded for training in ``precision``
    with ``cfg``'s dropout and the attention they call for (``common.transformer_kwargs``); a raw BERT gets mean
    pooling and normalisation."""
    from sentence_transformers import SentenceTransformer

    from retr.retrieval.models import ModelRef

    path = ModelRef.resolve(cfg.base).path
    source = str(path)
    kwargs = transformer_kwargs(path, cfg, precision)
    if (path / "modules.json").is_file():
        model = SentenceTransformer(source, device="cpu", **kwargs)
    else:
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

        if not (path / "config.json").is_file():
            raise RetrError(f"{path}: not a BERT or sentence-transformers folder (no config.json)")
        word = Transformer(source, max_seq_length=cfg.max_length, **kwargs)
        model = SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean"), Normalize()],
                                    device="cpu")
    model.max_seq_length = cfg.max_length
    return model


@training_run
def train_bi_encoder(out: Path, cfg: BiEncoderTrainConfig, dataset: Dataset | None = None,
                     corpus: Corpus | None = None, resume: bool = False, callbacks: list | None = None) -> dict:
    """Train and write a sentence-transformers folder (+ retr_manifest.json) to ``out``."""
    import torch
    from datasets import Dataset as HFDataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    t0 = time.perf_counter()
    corpus = dataset.corpus if dataset is not None else corpus
    if corpus is None:
        raise RetrError("training needs --dataset or --corpus")
    texts = [d.full_text() for d in corpus.docs]
    doc_text = dict(zip(corpus.ids, texts, strict=True))
    qrels: Qrels | None = None
    if cfg.self_supervised:
        pairs, positives = self_supervised_pairs(corpus.docs, cfg.seed)
        doc_text_pos = {**doc_text, **positives}
        dev = dev_split({p.qid: p.query for p in pairs}, Qrels({p.qid: {p.positive_id: 1} for p in pairs}),
                        min(cfg.dev_fraction, 200 / max(1, len(pairs))), cfg.seed,  # at most 200 dev pairs
                        f" from {len(corpus.docs)} documents: --self-supervised makes a pair of a document's title and "
                        "body (>= 20 characters), or of one of its sentences and the others (two of >= 20 characters "
                        "at least); each pair needs both, and a tenth of the pairs go to dev")
    else:
        if dataset is None:
            raise RetrError("labeled training needs --dataset (or use --corpus with --self-supervised)")
        qrels = dataset.qrels
        dev = dev_split(dataset.queries, qrels, cfg.dev_fraction, cfg.seed)
        doc_text_pos = doc_text
    train_pairs = dev.pairs
    logger.info("%d training pairs, %d dev queries", len(train_pairs), len(dev.queries))
    mine = cfg.negatives == "model" and cfg.num_negatives > 0
    negatives, candidates = bm25_negatives(corpus, texts, train_pairs, qrels, dev, 0 if mine else cfg.num_negatives, cfg)
    precision = resolve_precision(cfg.precision)
    model = load_st_model(cfg, precision)
    if mine:  # the model being trained mines its own, before its first step
        from retr.train.negatives import mine_model_negatives

        mined = mine_model_negatives(model, train_pairs, doc_text_pos, corpus.ids, texts, qrels, cfg.num_negatives,
                                     depth=cfg.negative_depth)
        train_pairs, negatives = [p for p, n in zip(train_pairs, mined, strict=True) if n], [n for n in mined if n]
    teacher_factor = None
    if cfg.teacher is not None:
        from retr.train.teacher import student_units, teacher_logits

        logits = teacher_logits(cfg.teacher, [p.query for p in train_pairs],
                                [[doc_text[d] for d in (p.positive_id, *negs)]
                                 for p, negs in zip(train_pairs, negatives, strict=True)])
    columns = pair_columns(train_pairs, negatives, doc_text_pos, doc_text)
    frozen = freeze_bottom(model, cfg.freeze_layers)
    if cfg.teacher is not None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):  # as the steps run
            teacher_factor = student_units(model, logits, train_pairs, negatives, doc_text_pos, cfg.scale)
        columns["label"] = (logits * teacher_factor).tolist()
    train_ds = HFDataset.from_dict(columns)
    score_all = embedding_scorer(dev.queries, candidates, doc_text_pos, precision, normalize_embeddings=True)
    evaluator = dev_evaluator(score_all, dev.qrels)
    base_dev = evaluator(model)["dev_ndcg@10"]
    logger.info("before training: dev nDCG@10 %.4f", base_dev)
    if cfg.teacher is not None:
        from retr.train.losses import TeacherMNRL

        loss = TeacherMNRL(model, scale=cfg.scale, weight=cfg.teacher_weight)
    elif cfg.mini_batch_size < cfg.batch_size:  # GradCache: memory bounded by the mini-batch, ~1.3x the compute
        loss = CachedMultipleNegativesRankingLoss(model, scale=cfg.scale, mini_batch_size=cfg.mini_batch_size)
    else:  # the whole batch fits: the same loss and gradients without the extra forward pass
        loss = MultipleNegativesRankingLoss(model, scale=cfg.scale)
    result = fit(SentenceTransformerTrainer, SentenceTransformerTrainingArguments, out, cfg, precision, len(train_pairs),
                 resume, model=model, train_dataset=train_ds, loss=loss, evaluator=evaluator, callbacks=callbacks)
    extra = {
        "base": cfg.base_name, "train_pairs": len(train_pairs), **frozen, "dev_queries": len(dev.queries),
        "data_sha256": pairs_digest(train_pairs), "corpus_sha256": corpus.sha256,
        "dev_ndcg@10_before": base_dev, "precision": precision, "teacher_factor": teacher_factor,
        **teacher_record(cfg.teacher), **result, "train_seconds": time.perf_counter() - t0,
    }
    return write_output(out, lambda p: model.save(str(p)), "retr-bi-encoder", cfg, extra)
