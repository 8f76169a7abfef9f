"""A trained cross-encoder as a teacher: its scores for the lists of the bi-encoder and cross-encoder trainers."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from retr.train.data import Pair

logger = logging.getLogger(__name__)


def teacher_logits(teacher: str, queries: Sequence[str], docs: Sequence[Sequence[str]]) -> np.ndarray:
    """For each query, the cross-encoder's raw logits for its documents (the judged positive first, then its
    negatives; every list as long): the scores it reranks with before any interpolation, its documents read as it
    reads them when reranking, at its length, scored in one length-sorted pass."""
    from sentence_transformers.cross_encoder import CrossEncoder

    from retr.retrieval.backends.export import ce_logits
    from retr.retrieval.focus import reader
    from retr.retrieval.rerank import cross_encoder_reading, cross_encoder_ref

    path = cross_encoder_ref(teacher).path  # a folder, or a hub id in the local Hugging Face cache
    max_length, inputs = cross_encoder_reading(path)
    model = CrossEncoder(str(path), num_labels=1, max_length=max_length, device="cpu")
    read = reader(inputs, path, max_length)
    width = len(docs[0]) if docs else 1
    flat = [(q, t) for q, texts in zip(queries, docs, strict=True) for t in read(q, list(texts))]
    logger.info("teacher %s scores %d lists of %d documents", path, len(queries), width)
    logits = ce_logits(model, flat).reshape(len(queries), width)
    logger.info("teacher: judged positive first in %.1f%% of lists, mean margin over the negatives %.2f",
                100 * float(np.mean(logits.argmax(1) == 0)), float(np.mean(logits[:, :1] - logits[:, 1:])))
    return logits


def teacher_record(teacher: str | None) -> dict:
    """What the output's manifest says of the teacher: its folder and the hash of its files (None: no teacher)."""
    if teacher is None:
        return {"teacher": None, "teacher_hash": None}
    from retr.retrieval.models import ModelRef

    return {"teacher": teacher, "teacher_hash": ModelRef.resolve(teacher).hash}


def student_units(model, teacher: np.ndarray, pairs: Sequence[Pair], negatives: Sequence[Sequence[str]],
                  doc_text: dict[str, str], scale: float) -> float:
    """The factor that puts the teacher's logits in the student's units before training: the student's mean
    absolute margin (``scale`` x cosine) between each list's positive and its negatives, over the teacher's. A
    teacher whose logits sit far closer together than the student's scores would otherwise pull the positive and
    the negatives together (a SciFact cross-encoder: mean margin 0.45 logits; MiniLM's 4.98)."""
    queries = model.encode([p.query for p in pairs], convert_to_numpy=True, normalize_embeddings=True,
                           show_progress_bar=False)
    docs = [doc_text[d] for p, negs in zip(pairs, negatives, strict=True) for d in (p.positive_id, *negs)]
    emb = model.encode(docs, convert_to_numpy=True, normalize_embeddings=True, batch_size=32, show_progress_bar=False)
    student = scale * np.einsum("bd,bkd->bk", queries, emb.reshape(len(pairs), teacher.shape[1], -1))
    margin_student = float(np.abs(student[:, :1] - student[:, 1:]).mean())
    margin_teacher = float(np.abs(teacher[:, :1] - teacher[:, 1:]).mean())
    factor = margin_student / margin_teacher if margin_teacher > 0 else 1.0
    logger.info("teacher logits x %.2f: mean margin %.3f -> the student's %.3f", factor, margin_teacher,
                margin_student)
    return factor
