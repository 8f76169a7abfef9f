"""A trained cross-encoder as a teacher: its scores for the bi-encoder trainer's lists."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retr.train.data import Pair

logger = logging.getLogger(__name__)


def teacher_logits(teacher: str, pairs: Sequence[Pair], negatives: Sequence[Sequence[str]],
                   doc_text: dict[str, str], max_length: int) -> list[list[float]]:
    """For each pair, the cross-encoder's raw logits for [positive, *negatives] (the scores it reranks with before
    any interpolation), scored in one length-sorted pass."""
    from sentence_transformers.cross_encoder import CrossEncoder

    from retr.retrieval.backends.export import ce_logits
    from retr.retrieval.rerank import check_cross_encoder_dir

    path = Path(teacher)
    check_cross_encoder_dir(path)
    model = CrossEncoder(str(path), num_labels=1, max_length=max_length, device="cpu")
    width = 1 + len(negatives[0]) if negatives else 1
    flat = [(p.query, doc_text[d]) for p, negs in zip(pairs, negatives, strict=True) for d in (p.positive_id, *negs)]
    logger.info("teacher %s scores %d lists of %d documents", path, len(pairs), width)
    logits = ce_logits(model, flat).reshape(len(pairs), width)
    logger.info("teacher: judged positive first in %.1f%% of lists, mean margin over the negatives %.2f",
                100 * float(np.mean(logits.argmax(1) == 0)), float(np.mean(logits[:, :1] - logits[:, 1:])))
    return logits.tolist()
