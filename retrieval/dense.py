"""Dense retrieval: encode the query with the bi-encoder, search the FAISS index."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retr.retrieval.encoder import BiEncoder
from retr.retrieval.errors import RetrError
from retr.retrieval.protocol import StageTimer
from retr.retrieval.types import Hit, Run


def check_encoder(index_folder, dense_info: Mapping, encoder: BiEncoder) -> None:
    """Refuse an index whose vectors came from another model than the query encoder."""
    built = dense_info["model"]
    if encoder.dim != dense_info["dim"]:
        raise RetrError(f"{index_folder}: built with {built['id']} ({dense_info['dim']} dims) but the query encoder "
                        f"{encoder.model_id} gives {encoder.dim} dims: search with --model {built['id']} or "
                        f"rebuild with `retr index --model {encoder.model_id}`")
    if encoder.model_hash != built["hash"]:
        raise RetrError(f"{index_folder}: built with model {built['id']} (hash {built['hash'][:12]}) but the query "
                        f"encoder {encoder.model_id} has hash {encoder.model_hash[:12]}: search with the model that "
                        f"built the index or rebuild with `retr index --model {encoder.model_id}`")


class DenseRetriever:
    name = "dense"
    stages = ("encode", "ann")

    def __init__(self, index, ids: Sequence[str], encoder: BiEncoder):
        self.index = index
        self.ids = list(ids)
        self.encoder = encoder

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        timer = timer or StageTimer()
        qids = list(queries)
        if not qids:
            return Run({})
        with timer.stage("encode"):
            q = self.encoder.encode_queries([queries[x] for x in qids], show_progress=len(qids) > 1000)
        with timer.stage("ann"):
            k_eff = min(k, len(self.ids))
            scores, positions = self.index.search(np.ascontiguousarray(q, dtype=np.float32), k_eff)
            ids = self.ids
            run = {qid: [Hit(ids[p], s) for p, s in zip(positions[i].tolist(), scores[i].tolist(), strict=True)
                         if p >= 0]
                   for i, qid in enumerate(qids)}
        return Run(run)
