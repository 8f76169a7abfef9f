"""`retr train sparse-encoder`: a learned sparse encoder (sentence-transformers' ``SparseEncoder``) from the bundled
MiniLM or any BERT / sentence-transformers folder.

Two kinds, on the same labeled pairs, BM25 hard negatives and dev split as the bi-encoder trainer:

- ``csr`` (the default): Contrastive Sparse Representation. The dense model's pooled vector goes through a sparse
  auto-encoder (``hidden_factor`` x its dimension, top-``active_dims`` kept); ``CSRLoss`` = reconstruction of the
  dense vector + sparse in-batch-negative ranking. Cheap: no vocabulary-sized output.
- ``splade``: an MLM head (the base's own, or a new one with the decoder tied to the word embeddings: run
  ``retr train mlm`` first to adapt it) with SPLADE max pooling over the vocabulary, ``SpladeLoss`` = sparse
  ranking + FLOPS regularisation on documents and queries.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from retr.eval.data import Dataset
from retr.retrieval.errors import RetrError
from retr.retrieval.types import Qrels
from retr.train.common import (
    TrainConfig,
    dev_evaluator,
    freeze_bottom,
    resolve_precision,
    run_trainer,
    trainer_kwargs,
    write_output,
)
from retr.train.data import labeled_pairs, pairs_digest, split_dev
from retr.train.negatives import mine_bm25_negatives, temporary_bm25
from retr.train.runtime import training_run

logger = logging.getLogger(__name__)

SPARSE_KINDS = ("csr", "splade")


@dataclass(frozen=True)
class SparseEncoderTrainConfig(TrainConfig):
    kind: str = "csr"
    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 4e-5
    max_length: int = 256
    num_negatives: int = 1
    negative_depth: int = 30
    dev_fraction: float = 0.1  # the bi-encoder trainer's split with the same seed
    dev_candidates: int = 10
    active_dims: int = 96  # csr: non-zero dimensions kept per text (top-k of the auto-encoder)
    hidden_factor: int = 4  # csr: the sparse space is this many times the dense dimension
    document_regularizer: float = 3e-5  # splade: FLOPS weight on documents
    query_regularizer: float = 5e-5  # splade: FLOPS weight on queries
    precision: str = "auto"
    # the embeddings and the first 4 of MiniLM's 6 layers take no gradient: on the shared 2-core AVX2 EPYC a full
    # backward pass did not fit the time there was (see docs/studies/sparse-late-interaction.md)
    freeze_layers: int = 4
    attention_dropout: float | None = 0.0  # as the bi-encoder trainer: the fused CPU attention kernel

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in SPARSE_KINDS:
            raise RetrError(f"sparse encoder kind {self.kind!r}: choose one of {', '.join(SPARSE_KINDS)}")
        if self.active_dims < 1 or self.hidden_factor < 1:
            raise RetrError("--active-dims and --hidden-factor must be >= 1")


def build_sparse_model(cfg: SparseEncoderTrainConfig, precision: str):
    """The untrained ``SparseEncoder`` of ``cfg.kind`` over ``cfg.base``."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder, SpladePooling

    from retr.retrieval.models import ModelRef
    from retr.train.bi_encoder import load_st_model
    from retr.train.common import transformer_kwargs

    if cfg.kind == "csr":
        dense = load_st_model(cfg, precision)
        dim = dense.get_embedding_dimension()
        sae = SparseAutoEncoder(input_dim=dim, hidden_dim=cfg.hidden_factor * dim, k=cfg.active_dims,
                                k_aux=2 * cfg.active_dims)
        model = SparseEncoder(modules=[*dense, sae], device="cpu")
    else:
        path = ModelRef.resolve(cfg.base).path
        from sentence_transformers.base.modules import Transformer

        mlm = Transformer(str(path), transformer_task="fill-mask", max_seq_length=cfg.max_length,
                          **transformer_kwargs(path, cfg, precision))
        model = SparseEncoder(modules=[mlm, SpladePooling("max")], device="cpu")
    model.max_seq_length = cfg.max_length
    return model


@training_run
def train_sparse_encoder(out: Path, cfg: SparseEncoderTrainConfig, dataset: Dataset, resume: bool = False,
                         callbacks: list | None = None) -> dict:
    """Train and write a sentence-transformers ``SparseEncoder`` folder (+ retr_manifest.json) to ``out``."""
    import torch
    from datasets import Dataset as HFDataset
    from sentence_transformers import SparseEncoderTrainer, SparseEncoderTrainingArguments
    from sentence_transformers.sparse_encoder.losses import (
        CSRLoss,
        SparseMultipleNegativesRankingLoss,
        SpladeLoss,
    )

    from retr.train.bi_encoder import _dev_candidates

    t0 = time.perf_counter()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    corpus, qrels = dataset.corpus, dataset.qrels
    doc_text = {d.doc_id: d.full_text() for d in corpus.docs}
    train_q, dev_q = split_dev(qrels, cfg.dev_fraction, cfg.seed)
    train_pairs = labeled_pairs(dataset.queries, qrels, train_q)
    dev_queries = {q: dataset.queries[q] for q in dev_q}
    dev_qrels = Qrels({q: qrels[q] for q in dev_q})
    if not train_pairs or not dev_queries:
        raise RetrError(f"too little training data: {len(train_pairs)} pairs, {len(dev_queries)} dev queries")
    with temporary_bm25(corpus.ids, list(doc_text.values())) as bm25:
        negatives = (mine_bm25_negatives(train_pairs, bm25, qrels, cfg.num_negatives, cfg.seed,
                                         depth=cfg.negative_depth) if cfg.num_negatives else [[] for _ in train_pairs])
        candidates = _dev_candidates(bm25, dev_queries, dev_qrels, cfg.dev_candidates)
    columns = {"anchor": [p.query for p in train_pairs], "positive": [doc_text[p.positive_id] for p in train_pairs]}
    for j in range(cfg.num_negatives):
        columns[f"negative_{j + 1}"] = [doc_text[n[j]] for n in negatives]
    precision = resolve_precision(cfg.precision)
    model = build_sparse_model(cfg, precision)
    frozen = freeze_bottom(model, cfg.freeze_layers)

    def score_all(model):
        qids = list(dev_queries)
        docs = sorted({d for q in qids for d in candidates[q]})
        pos = {d: i for i, d in enumerate(docs)}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            q_emb = model.encode_query([dev_queries[q] for q in qids], convert_to_sparse_tensor=False,
                                       show_progress_bar=False).float()
            d_emb = model.encode_document([doc_text[d] for d in docs], convert_to_sparse_tensor=False,
                                          batch_size=32, show_progress_bar=False).float()
        scores = (q_emb @ d_emb.T).numpy()
        return {q: {d: float(scores[i, pos[d]]) for d in candidates[q]} for i, q in enumerate(qids)}

    evaluator = dev_evaluator(score_all, dev_qrels)
    base_dev = evaluator(model)["dev_ndcg@10"]
    logger.info("before training: dev nDCG@10 %.4f", base_dev)
    ranking = SparseMultipleNegativesRankingLoss(model)
    if cfg.kind == "csr":
        loss = CSRLoss(model, loss=ranking)
    else:
        loss = SpladeLoss(model, loss=ranking, document_regularizer_weight=cfg.document_regularizer,
                          query_regularizer_weight=cfg.query_regularizer)
    args = SparseEncoderTrainingArguments(**trainer_kwargs(out, cfg, len(train_pairs)), bf16=precision == "bf16")
    trainer = SparseEncoderTrainer(model=model, args=args, train_dataset=HFDataset.from_dict(columns), loss=loss,
                                   evaluator=evaluator, callbacks=callbacks)
    result = run_trainer(trainer, out, resume)
    seconds = time.perf_counter() - t0
    extra = {"base": cfg.base_name, "sparse_kind": cfg.kind, "train_pairs": len(train_pairs), **frozen,
             "dev_queries": len(dev_queries), "data_sha256": pairs_digest(train_pairs), "corpus_sha256": corpus.sha256,
             "dev_ndcg@10_before": base_dev, "precision": precision, **result, "train_seconds": seconds}
    return write_output(out, lambda p: model.save(str(p)), "retr-sparse-encoder", cfg, extra)
