"""Dense retrieval: encode the query with the bi-encoder, search the FAISS index."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retr.retrieval.encoder import BiEncoder
from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef
from retr.retrieval.protocol import StageTimer
from retr.retrieval.types import Hit, Run


def check_model(index_folder, dense_info: Mapping, model: ModelRef, chosen: bool) -> None:
    """Refuse an index whose vectors came from another model than ``model`` (before any graph is loaded).
    ``chosen``: the user named the model (else it was read from the index's manifest)."""
    built = dense_info["model"]
    if model.hash != built["hash"]:
        fix = (f"search without --model (the index records {built['id']}) or rebuild it with "
               f"`retr index --model {model.id}`" if chosen else
               f"the model recorded in it ({built['id']}) has changed since it was built: rebuild the index")
        raise RetrError(f"{index_folder}: built with model {built['id']} (hash {built['hash'][:12]}) but the query "
                        f"encoder {model.id} has hash {model.hash[:12]}: {fix}")


def check_dimension(index_folder, dense_info: Mapping, encoder: BiEncoder) -> None:
    if encoder.dim != dense_info["dim"]:
        raise RetrError(f"{index_folder}: holds {dense_info['dim']}-d vectors but the query encoder "
                        f"{encoder.model_id} gives {encoder.dim} dims: rebuild the index")


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
