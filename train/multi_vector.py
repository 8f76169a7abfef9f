"""`retr train multi-vector`: a late-interaction encoder (sentence-transformers' ``MultiVectorEncoder``,
ColBERT-style: every token's vector projected to ``dim``, MaxSim between a query's and a document's) from the
bundled MiniLM or any BERT / sentence-transformers folder, on the labeled pairs, BM25 hard negatives and dev split
the other trainers use; its loss is sentence-transformers' multi-vector in-batch-negative ranking loss."""

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
    fit,
    freeze_bottom,
    labeled_inputs,
    resolve_precision,
    transformer_kwargs,
    write_output,
)
from retr.train.data import pairs_digest
from retr.train.runtime import training_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MultiVectorTrainConfig(TrainConfig):
    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 3e-5
    max_length: int = 256
    dim: int = 128  # each token vector's dimension after the projection (ColBERT's)
    num_negatives: int = 1
    negative_depth: int = 30
    dev_fraction: float = 0.1  # the bi-encoder trainer's split with the same seed
    dev_candidates: int = 10
    precision: str = "auto"
    # the embeddings and the first 4 of MiniLM's 6 layers take no gradient, as the sparse trainer's: a full backward
    # pass of 3 epochs was on course for 1 h 45 min on the shared 2-core AVX2 EPYC (5 of 81 steps in 7 min)
    freeze_layers: int = 4
    attention_dropout: float | None = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim < 1:
            raise RetrError("--dim must be >= 1")


def build_multivector_model(cfg: MultiVectorTrainConfig, precision: str):
    """The untrained ``MultiVectorEncoder`` over ``cfg.base``: its transformer, a ``dim`` projection of every token,
    the scoring mask and normalisation."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    from retr.retrieval.models import ModelRef

    path = ModelRef.resolve(cfg.base).path
    word = Transformer(str(path), max_seq_length=cfg.max_length, **transformer_kwargs(path, cfg, precision))
    proj = Dense(word.get_embedding_dimension(), cfg.dim, bias=False, activation_function=torch.nn.Identity(),
                 module_input_name="token_embeddings", module_output_name="token_embeddings")
    norm = Normalize(module_input_name="token_embeddings", module_output_name="token_embeddings")
    return MultiVectorEncoder(modules=[word, proj, MultiVectorMask(), norm], device="cpu")


@training_run
def train_multi_vector(out: Path, cfg: MultiVectorTrainConfig, dataset: Dataset, resume: bool = False,
                       callbacks: list | None = None) -> dict:
    """Train and write a ``MultiVectorEncoder`` folder (+ retr_manifest.json) to ``out``."""
    import torch
    from datasets import Dataset as HFDataset
    from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss
    from sentence_transformers.multi_vector_encoder.trainer import MultiVectorEncoderTrainer
    from sentence_transformers.multi_vector_encoder.training_args import MultiVectorEncoderTrainingArguments

    t0 = time.perf_counter()
    corpus = dataset.corpus
    doc_text, dev, columns, candidates = labeled_inputs(dataset, cfg)
    train_pairs = dev.pairs
    dev_queries = dev.queries
    precision = resolve_precision(cfg.precision)
    model = build_multivector_model(cfg, precision)
    frozen = freeze_bottom(model, cfg.freeze_layers)

    def score_all(model):  # every candidate document encoded once, however many dev queries list it
        qids = list(dev_queries)
        docs = sorted({d for q in qids for d in candidates[q]})
        pos = {d: i for i, d in enumerate(docs)}
        scores = {}
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            q_emb = model.encode_query([dev_queries[q] for q in qids], show_progress_bar=False)
            d_emb = model.encode_document([doc_text[d] for d in docs], batch_size=32, show_progress_bar=False)
            for i, q in enumerate(qids):
                listed = candidates[q]
                sims = model.similarity(q_emb[i:i + 1], [d_emb[pos[d]] for d in listed])[0].float().numpy()
                scores[q] = {d: float(s) for d, s in zip(listed, sims, strict=True)}
        return scores

    evaluator = dev_evaluator(score_all, dev.qrels)
    base_dev = evaluator(model)["dev_ndcg@10"]
    logger.info("before training: dev nDCG@10 %.4f", base_dev)
    result = fit(MultiVectorEncoderTrainer, MultiVectorEncoderTrainingArguments, out, cfg, precision, len(train_pairs),
                 resume, model=model, train_dataset=HFDataset.from_dict(columns),
                 loss=MultiVectorMultipleNegativesRankingLoss(model), evaluator=evaluator, callbacks=callbacks)
    seconds = time.perf_counter() - t0
    extra = {"base": cfg.base_name, "dim": cfg.dim, "train_pairs": len(train_pairs), **frozen,
             "dev_queries": len(dev_queries), "data_sha256": pairs_digest(train_pairs), "corpus_sha256": corpus.sha256,
             "dev_ndcg@10_before": base_dev, "precision": precision, **result, "train_seconds": seconds}
    return write_output(out, lambda p: model.save(str(p)), "retr-multi-vector", cfg, extra)
