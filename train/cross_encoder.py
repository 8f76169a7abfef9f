"""`retr train cross-encoder`: BERT + one-logit head, trained listwise on the first stage's mistakes.

Each training query brings its positive and hard negatives taken from the ranking of the first
stage the model will rerank at inference time (the hybrid of BM25 and a bi-encoder), with judged
documents and near-duplicates of the positive excluded. sentence-transformers' cross-encoder
MNRL loss scores the positive against those negatives and in-batch ones (a softmax over the
list). The checkpoint is chosen by dev nDCG@10 of reranking the first stage's dev top-k.
"""

from __future__ import annotations

import gc
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from retr.eval.data import Dataset
from retr.retrieval.backends.export import ce_logits
from retr.retrieval.errors import RetrError
from retr.retrieval.focus import check_inputs, reader
from retr.retrieval.rerank import WEIGHT_RULE, smoothed_best
from retr.retrieval.types import Qrels, check_float
from retr.train.common import (
    TrainConfig,
    dev_evaluator,
    dev_ndcg,
    dev_split,
    fit,
    freeze_bottom,
    keep_bottom,
    resolve_precision,
    transformer_kwargs,
    write_output,
)
from retr.train.data import pairs_digest
from retr.train.runtime import training_run
from retr.train.teacher import teacher_record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CrossEncoderTrainConfig(TrainConfig):
    first_stage_model: str | None = None  # bi-encoder of the hybrid first stage (default: bundled)
    # more passes over shorter lists: on SciFact dev, 5 epochs of lists with 2 hard negatives give alone 0.7662 and
    # interpolated 0.8056, against 0.7642 / 0.8000 for 4 epochs with 3 and 0.7305 / 0.7893 for 2 epochs with 7, in
    # 29 min on 2 cores (README, "What the cross-encoder reads")
    epochs: int = 5
    batch_size: int = 8  # lists per step
    learning_rate: float = 5e-5  # the one-logit head starts from nothing
    num_negatives: int = 2  # hard negatives per list, from the first stage's top ``negative_depth``
    in_batch_negatives: int = 1  # other lists' documents added to each list (easy: one is enough)
    negative_depth: int = 30
    dev_fraction: float = 0.1  # the bi-encoder trainer's split (same seed): the first stage never saw dev
    dev_depth: int = 20
    precision: str = "auto"  # bf16 autocast where the CPU has native bf16 (~2x faster steps), else fp32
    # > 0: distillation. Each list's target mixes the judged positive (weight 1 - distill) with the first stage's
    # own ranking of the list (softmax of DISTILL_SHARPNESS x its min-max scores), so every candidate teaches;
    # the loss is ListNet (cross-entropy to that target) and no in-batch negatives are added
    distill: float = 0.0
    # what the model reads of a document (retr.retrieval.focus.INPUT_FORMS), at training and, recorded with the
    # model, at reranking. Focused at 128 tokens: on SciFact, one epoch from the same bi-encoder and the same lists,
    # dev nDCG@10 alone 0.6812 against 0.6267 for the head at 256 tokens (interpolated 0.7933 against 0.7875 at
    # best), trained in 727 s against 1,968 s, reranking at half the cost (README, "What the cross-encoder reads")
    inputs: str = "focused"
    max_length: int = 128
    layers: int = 0  # > 0: keep only the base's first ``layers`` transformer layers (a smaller, faster reranker)
    # a trained cross-encoder whose logits for each list (softmax, mixed with the judged positive by ``distill``)
    # are the ListNet target instead of the first stage's ranking: a smaller student learns from a larger model
    teacher: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float(self.distill, "--distill", 0.0, 1.0, open_high=True)
        check_float(self.dev_fraction, "--dev-fraction", 0.0, 1.0, open_high=True)
        if self.layers < 0:
            raise RetrError(f"--layers must be >= 0, got {self.layers}")
        if self.teacher is not None and self.distill <= 0:
            raise RetrError("--teacher needs --distill w > 0 (the teacher's share of each list's target)")
        check_inputs(self.inputs)


DISTILL_SHARPNESS = 5.0  # the first stage's min-max scores in [0, 1], times this, before its softmax


def distill_labels(first_scores: list[float], weight: float) -> list[float]:
    """ListNet labels for a list whose first item is the judged positive, distilling the first stage's ranking:
    ``mixed_target`` of softmax(DISTILL_SHARPNESS x minmax(first_scores))."""
    import numpy as np

    from retr.retrieval.rerank import minmax

    return mixed_target(DISTILL_SHARPNESS * minmax(np.asarray(first_scores, dtype=np.float64)), weight)


def mixed_target(teacher_logits, weight: float) -> list[float]:
    """ListNet labels (the loss takes softmax(labels) as its target) for a list whose first item is the judged
    positive: log((1 - weight) * one-hot(0) + weight * softmax(teacher_logits))."""
    import numpy as np

    z = np.asarray(teacher_logits, dtype=np.float64)
    teacher = np.exp(z - z.max())
    target = weight * teacher / teacher.sum()
    target[0] += 1.0 - weight
    return np.log(target).tolist()


def teacher_labels(cfg: CrossEncoderTrainConfig, queries: list[str], doc_lists: list[list[str]]) -> list[list[float]]:
    """ListNet labels of each query's documents (the judged positive first) from ``cfg.teacher``'s logits."""
    from retr.train.teacher import teacher_logits

    return [mixed_target(row, cfg.distill) for row in teacher_logits(cfg.teacher, queries, doc_lists)]


def first_stage_runs(dataset: Dataset, model: str | None, queries: dict[str, str], depth: int):
    """The hybrid (BM25 + bi-encoder, RRF) ranking of ``queries``, from retr's cached index."""
    from retr.indexes.build import IndexConfig, cached_index
    from retr.indexes.searcher import Searcher
    from retr.retrieval.encoder import BiEncoder, EncoderConfig
    from retr.retrieval.pipeline import parse

    cfg = IndexConfig(encoder=EncoderConfig(model=model))
    encoder = BiEncoder(cfg.encoder)
    index = cached_index(dataset.name, dataset.corpus, encoder, cfg)
    searcher = Searcher(index, query_encoder=encoder)
    try:
        return searcher.retriever(parse("hybrid")).search(queries, depth)
    finally:
        searcher.close()


def choose_interpolation(ce_scores, first, dev_q, depth: int, qrels: Qrels) -> tuple[float, dict[str, float]]:
    """The weight of the cross-encoder against the first stage chosen on dev nDCG@10 (``smoothed_best``), and the
    whole curve."""
    import numpy as np

    from retr.retrieval.rerank import interpolate

    curve = {}
    for alpha in [i / 10 for i in range(11)]:
        scores = {}
        for q in dev_q:
            head = first[q][:depth]
            ce = np.array([ce_scores[q][h.doc_id] for h in head], dtype=np.float32)
            fs = np.array([h.score for h in head], dtype=np.float32)
            scores[q] = dict(zip([h.doc_id for h in head], interpolate(ce, fs, alpha).tolist(), strict=True))
        curve[f"{alpha:.1f}"] = dev_ndcg(scores, qrels)
    best = smoothed_best(curve)
    logger.info("interpolation chosen on dev: %s x cross-encoder (dev nDCG@10 %.4f; best with its neighbours)", best,
                curve[best])
    return float(best), curve


@training_run
def train_cross_encoder(out: Path, cfg: CrossEncoderTrainConfig, dataset: Dataset, resume: bool = False,
                        callbacks: list | None = None) -> dict:
    from datasets import Dataset as HFDataset
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import ListNetLoss, MultipleNegativesRankingLoss

    from retr.retrieval.models import ModelRef

    t0 = time.perf_counter()
    rng = random.Random(cfg.seed)
    qrels = dataset.qrels
    dev = dev_split(dataset.queries, dataset.qrels, cfg.dev_fraction, cfg.seed)
    pairs, dev_q, dev_queries, dev_qrels = dev.pairs, list(dev.queries), dev.queries, dev.qrels
    texts = {d.doc_id: d.full_text() for d in dataset.corpus.docs}
    wanted = {**{p.qid: p.query for p in pairs}, **dev_queries}
    first = first_stage_runs(dataset, cfg.first_stage_model, wanted, max(cfg.negative_depth, cfg.dev_depth))
    gc.collect()  # the first stage's graphs and thread pools go before training starts
    lists = []  # (pair, its first-stage ranking, its hard negatives)
    for p in pairs:
        ranked = first[p.qid]
        cands = [h.doc_id for h in ranked[: cfg.negative_depth] if h.doc_id not in qrels[p.qid]]
        if len(cands) >= cfg.num_negatives:
            lists.append((p, ranked, rng.sample(cands, cfg.num_negatives)))

    def labels(p, ranked, negatives) -> list[float]:
        score = {h.doc_id: h.score for h in ranked}
        floor = min(score.values())  # a positive the first stage did not retrieve: its lowest score
        return distill_labels([score.get(d, floor) for d in (p.positive_id, *negatives)], cfg.distill)

    base_path = ModelRef.resolve(cfg.base).path
    read = reader(cfg.inputs, base_path, cfg.max_length)  # the base model's tokenizer counts
    queries = [p.query for p, _, _ in lists]
    doc_lists = [[texts[d] for d in (p.positive_id, *negatives)] for p, _, negatives in lists]  # positive first
    read_lists = [read(q, docs) for q, docs in zip(queries, doc_lists, strict=True)]
    columns: dict[str, list] = {"query": queries}
    if cfg.distill:
        columns["docs"] = read_lists
        columns["labels"] = (teacher_labels(cfg, queries, doc_lists) if cfg.teacher
                             else [labels(*one) for one in lists])
    else:
        columns["positive"] = [docs[0] for docs in read_lists]
        for j in range(cfg.num_negatives):
            columns[f"negative_{j + 1}"] = [docs[j + 1] for docs in read_lists]
    train_ds = HFDataset.from_dict(columns)
    candidates = {q: [h.doc_id for h in first[q][: cfg.dev_depth]] for q in dev_q}
    dev_read = {q: read(dev_queries[q], [texts[d] for d in cands]) for q, cands in candidates.items()}  # once
    logger.info("%d training lists (1 positive + %d negatives), %d dev queries", len(train_ds), cfg.num_negatives,
                len(dev_q))

    precision = resolve_precision(cfg.precision)
    model = CrossEncoder(str(base_path), num_labels=1, max_length=cfg.max_length, device="cpu",
                         **transformer_kwargs(base_path, cfg, precision))
    kept = keep_bottom(model, cfg.layers)
    frozen = freeze_bottom(model, cfg.freeze_layers)

    def score_all(model):
        scores = {}
        for q, cands in candidates.items():
            s = ce_logits(model, [(dev_queries[q], t) for t in dev_read[q]])
            scores[q] = {d: float(v) for d, v in zip(cands, s, strict=True)}
        return scores

    evaluator = dev_evaluator(score_all, dev_qrels)
    first_stage_dev = dev_ndcg({q: {h.doc_id: h.score for h in first[q][: cfg.dev_depth]} for q in dev_q}, dev_qrels)
    logger.info("before training: dev nDCG@10 %.4f of the first stage alone", first_stage_dev)
    loss = ListNetLoss(model) if cfg.distill else MultipleNegativesRankingLoss(model,
                                                                              num_negatives=cfg.in_batch_negatives)
    result = fit(CrossEncoderTrainer, CrossEncoderTrainingArguments, out, cfg, precision, len(train_ds), resume,
                 model=model, train_dataset=train_ds, loss=loss, evaluator=evaluator, callbacks=callbacks)
    alpha, alpha_curve = choose_interpolation(evaluator.best_scores(), first, dev_q, cfg.dev_depth, dev_qrels)
    seconds = time.perf_counter() - t0
    extra = {
        "base": cfg.base_name, "train_lists": len(train_ds), **kept, **frozen, "dev_queries": len(dev_q),
        "data_sha256": pairs_digest(pairs), "corpus_sha256": dataset.corpus.sha256,
        "precision": precision, "first_stage": "hybrid", "dev_ndcg@10_first_stage": first_stage_dev, **result, "train_seconds": seconds,
        "interpolation": alpha, "interpolation_rule": WEIGHT_RULE, **teacher_record(cfg.teacher), "inputs": cfg.inputs, "dev_ndcg@10_by_interpolation": alpha_curve,
    }
    return write_output(out, lambda p: model.save(str(p)), "retr-cross-encoder", cfg, extra)
