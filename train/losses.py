"""Training losses that sentence-transformers does not have, as small modules over its column embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TeacherMNRL(nn.Module):
    """Multiple-negatives ranking (each query's judged positive against every document of the batch) plus
    ``weight`` x KL(teacher || student) over each query's own list [positive, negative_1, ..., negative_n]: the
    teacher says how far apart the list's documents are, not only which one is judged.

    Columns: query, positive, negative_1..n (n >= 1); labels: the teacher's logits per list, shape (B, 1 + n)."""

    def __init__(self, model, scale: float = 20.0, weight: float = 1.0):
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        self.model = model
        self.scale = scale
        self.weight = weight
        self.contrastive = MultipleNegativesRankingLoss(model, scale=scale)

    def forward(self, sentence_features, labels: torch.Tensor) -> torch.Tensor:
        from sentence_transformers.base.losses.merged_forward import embed_columns

        emb = embed_columns(self.model, sentence_features)  # [(B, d)] x (2 + n): query, positive, negatives
        if len(emb) < 3:
            raise ValueError("TeacherMNRL needs query, positive and at least one negative column")
        contrastive = self.contrastive.compute_loss_from_embeddings(emb, labels)
        q = F.normalize(emb[0], dim=-1)  # (B, d)
        docs = F.normalize(torch.stack(emb[1:], dim=1), dim=-1)  # (B, 1 + n, d)
        student = self.scale * torch.einsum("bd,bkd->bk", q, docs)  # (B, 1 + n)
        teacher = torch.softmax(labels.detach().float(), dim=1)  # (B, 1 + n)
        kl = F.kl_div(F.log_softmax(student.float(), dim=1), teacher, reduction="batchmean")
        return contrastive + self.weight * kl

    def get_config_dict(self) -> dict:
        return {"scale": self.scale, "weight": self.weight}
