"""Dense retrieval: encode the query with the bi-encoder, search the FAISS index (of documents, or of passages
folded back into documents)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retr.retrieval.encoder import BiEncoder
from retr.retrieval.errors import RetrError
from retr.retrieval.mapped import attached, check_all
from retr.retrieval.models import ModelRef
from retr.retrieval.passages import PassageMap
from retr.retrieval.protocol import StageTimer
from retr.retrieval.stage import Stage
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


def check_prompts(index_folder, dense_info: Mapping, encoder: BiEncoder) -> None:
    """Refuse a query encoder whose query prompt is not the one the index was built for (an index from before
    prompts were recorded was built without any)."""
    recorded = (dense_info["model"].get("prompts") or {}).get("query", "")
    if encoder.prompts.query != recorded:
        raise RetrError(f"{index_folder}: built for queries with prompt {recorded!r} but the query encoder puts "
                        f"{encoder.prompts.query!r} before them: search with --query-prompt {recorded!r}, or rebuild "
                        f"the index with the prompts you want")


def _filtered_search(index, q: np.ndarray, k: int, allowed: np.ndarray):
    """FAISS search restricted to the positions ``allowed`` (sorted int64), returning k of them whenever k exist:
    the selector narrows the index's own search; where an approximate index (HNSW, IVF) still finds fewer, the
    allowed vectors are scored exactly (IVF: every list probed)."""
    import faiss

    sel = faiss.IDSelectorBatch(allowed)
    ivf = faiss.try_extract_index_ivf(index)
    top = faiss.downcast_index(index)
    refine = top if isinstance(top, faiss.IndexRefine) else None  # lean: the selector goes to its codes' search

    def wrapped(params):
        return params if refine is None else \
            faiss.IndexRefineSearchParameters(k_factor=refine.k_factor, base_index_params=params)

    if ivf is not None:
        params = faiss.SearchParametersIVF(sel=sel, nprobe=ivf.nprobe)
    elif isinstance(top, faiss.IndexHNSW):
        params = faiss.SearchParametersHNSW(sel=sel, efSearch=top.hnsw.efSearch)
    else:
        params = faiss.SearchParameters(sel=sel)
    scores, positions = index.search(q, k, params=wrapped(params))
    want = min(k, len(allowed))
    short = [i for i in range(len(q)) if int((positions[i] >= 0).sum()) < want]
    if short and ivf is not None:
        full = faiss.SearchParametersIVF(sel=sel, nprobe=ivf.nlist)
        s2, p2 = index.search(q[short], k, params=wrapped(full))
        scores[short], positions[short] = s2, p2
    elif short:
        vectors = index.reconstruct_batch(allowed)  # (m, dim): exact scores over the allowed documents
        sims = q[short] @ vectors.T
        top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        for row, i in enumerate(short):
            scores[i, :] = -np.inf
            positions[i, :] = -1
            scores[i, : top.shape[1]] = sims[row, top[row]]
            positions[i, : top.shape[1]] = allowed[top[row]]
    return scores, positions


def encoded_search(encoder: BiEncoder, queries: Mapping[str, str], k: int, timer: StageTimer | None,
                   search_vectors) -> Run:
    """Encode the queries (stage ``encode``), then ``search_vectors(qids, vectors, k)`` (stage ``ann``)."""
    timer = timer or StageTimer()
    qids = list(queries)
    if not qids:
        return Run({})
    with timer.stage("encode"):
        q = encoder.encode_queries([queries[x] for x in qids], show_progress=len(qids) > 1000)
    with timer.stage("ann"):
        return search_vectors(qids, q, k)


PASSAGE_DEPTH = 100  # passages searched per query at least (4k where larger); deepened until k documents come


class DenseRetriever:
    name = "dense"
    stages = ("encode", "ann")

    def __init__(self, index, ids: Sequence[str], encoder: BiEncoder, allowed: np.ndarray | None = None,
                 passages: PassageMap | None = None):
        """``allowed``: the only document positions that may be returned (a metadata filter), or None for all;
        ``passages``: the index holds passages, these documents' (else one vector per document)."""
        self.index = index
        self.ids = list(ids)
        self.encoder = encoder
        self.allowed = allowed
        self.passages = passages

    def search(self, queries: Mapping[str, str], k: int, timer: StageTimer | None = None) -> Run:
        return encoded_search(self.encoder, queries, k, timer, self.search_vectors)

    def search_vectors(self, qids: list[str], q: np.ndarray, k: int) -> Run:
        """The top ``k`` for query vectors ``q`` (one per id in ``qids``)."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        check_all(attached(self.index))  # its mapped parts, where it has any, not cut short: never SIGBUS
        if self.allowed is not None and len(self.allowed) == 0:
            return Run({qid: [] for qid in qids})
        if self.passages is not None:
            found = self._passage_search(q, k)
        elif self.allowed is None:
            found = self.index.search(q, min(k, len(self.ids)))
        else:
            found = _filtered_search(self.index, q, min(k, len(self.allowed)), self.allowed)
        ids = self.ids
        return Run({qid: [Hit(ids[p], s) for p, s in zip(found[1][i].tolist(), found[0][i].tolist(), strict=True)
                          if p >= 0]
                    for i, qid in enumerate(qids)})

    def _passage_search(self, q: np.ndarray, k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each query's top-k documents by their passages' aggregate: passages searched ``PASSAGE_DEPTH`` (or
        4k) deep, deeper while a query has fewer than k documents and passages remain."""
        pm = self.passages
        rows = pm.rows_of(self.allowed)
        total = self.index.ntotal if rows is None else len(rows)
        want = min(k, pm.num_docs if self.allowed is None else len(self.allowed))
        depth = min(total, max(4 * k, PASSAGE_DEPTH))
        while True:
            if rows is None:
                scores, hits = self.index.search(q, depth)
            else:
                scores, hits = _filtered_search(self.index, q, depth, rows)
            folded = [pm.fold(scores[i], hits[i], k) for i in range(len(q))]
            if depth >= total or all(len(d) >= want for d, _ in folded):
                return [s for _, s in folded], [d for d, _ in folded]
            depth = min(total, depth * 4)


STAGE = Stage("dense", "source", lambda ctx, node, inputs: ctx.parts.dense(ctx.allowed, ctx.config.passage_aggregate),
              "the bi-encoder's query vector searched in the index's FAISS part", needs=("dense",))
