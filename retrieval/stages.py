"""The stage registry: every stage a pipeline may name, one line each. A new stage is one module (its retriever
and its ``STAGE`` declaration, ``retr.retrieval.stage.Stage``) plus one line here."""

from __future__ import annotations

from retr.retrieval import bm25, cut, dense, fuse, multivector, rerank, rm3, sparse
from retr.retrieval.stage import Stage

STAGES: dict[str, Stage] = {s.name: s for s in (
    bm25.STAGE,  # a first stage: BM25 (bm25s)
    dense.STAGE,  # a first stage: the bi-encoder and FAISS
    sparse.STAGE,  # a first stage: the learned sparse encoder over the index's CSR part (exact or Seismic)
    fuse.STAGE,  # fuse(a,b,...): fusion of any number of lists
    rerank.STAGE,  # +rerank: the cross-encoder
    multivector.STAGE,  # +maxsim: late interaction (a multi-vector encoder's MaxSim over cached token vectors)
    cut.STAGE,  # %n: a cut-off
    rm3.STAGE,  # +rm3: RM3 pseudo-relevance feedback, searched with BM25
)}

# names that stand for a composition: (stage, names of its inputs); the canonical text of that composition
ALIASES: dict[str, tuple[str, tuple[str, ...]]] = {"hybrid": ("fuse", ("bm25", "dense")),
                                                    "hybrid3": ("fuse", ("bm25", "dense", "splade"))}
