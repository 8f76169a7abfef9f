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
import time
from dataclasses import dataclass
from pathlib import Path

from retr.eval.data import Dataset
from retr.retrieval.errors import RetrError
from retr.train.common import (
    TrainConfig,
    dev_evaluator,
    embedding_scorer,
    fit,
    freeze_bottom,
    labeled_inputs,
    resolve_precision,
    write_output,
)
from retr.train.data import pairs_digest
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
    from datasets import Dataset as HFDataset
    from sentence_transformers import SparseEncoderTrainer, SparseEncoderTrainingArguments
    from sentence_transformers.sparse_encoder.losses import (
        CSRLoss,
        SparseMultipleNegativesRankingLoss,
        SpladeLoss,
    )

    t0 = time.perf_counter()
    corpus = dataset.corpus
    doc_text, dev, columns, candidates = labeled_inputs(dataset, cfg)
    train_pairs = dev.pairs
    precision = resolve_precision(cfg.precision)
    model = build_sparse_model(cfg, precision)
    frozen = freeze_bottom(model, cfg.freeze_layers)
    score_all = embedding_scorer(dev.queries, candidates, doc_text, precision, convert_to_sparse_tensor=False)
    evaluator = dev_evaluator(score_all, dev.qrels)
    base_dev = evaluator(model)["dev_ndcg@10"]
    logger.info("before training: dev nDCG@10 %.4f", base_dev)
    ranking = SparseMultipleNegativesRankingLoss(model)
    if cfg.kind == "csr":
        loss = CSRLoss(model, loss=ranking)
    else:
        loss = SpladeLoss(model, loss=ranking, document_regularizer_weight=cfg.document_regularizer,
                          query_regularizer_weight=cfg.query_regularizer)
    result = fit(SparseEncoderTrainer, SparseEncoderTrainingArguments, out, cfg, precision, len(train_pairs), resume,
                 model=model, train_dataset=HFDataset.from_dict(columns), loss=loss, evaluator=evaluator,
                 callbacks=callbacks)
    seconds = time.perf_counter() - t0
    extra = {"base": cfg.base_name, "sparse_kind": cfg.kind, "train_pairs": len(train_pairs), **frozen,
             "dev_queries": len(dev.queries), "data_sha256": pairs_digest(train_pairs), "corpus_sha256": corpus.sha256,
             "dev_ndcg@10_before": base_dev, "precision": precision, **result, "train_seconds": seconds}
    return write_output(out, lambda p: model.save(str(p)), "retr-sparse-encoder", cfg, extra)
