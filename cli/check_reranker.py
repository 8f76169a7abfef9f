"""`retr check-reranker IDX MODEL`: the reranker check as its own step.

A cross-encoder trained on another corpus is checked on pseudo-queries cut from the index's own documents
(``retr.eval.pseudo``) when it is first put together with an index: here, by `retr eval`, or when `retr serve`
starts. The check is stored beside the index (``<index>/rerank-checks/<key>.json``, so that a copy of the index keeps
it) and in the cache, keyed by the corpus, the cross-encoder, the index's dense model, depth, length and input form;
`retr eval --index` and `retr serve` store the checks they run there too, and all of them read a stored one from
there first. `retr search` and the Python API only read it: a search never builds an index or loads the corpus.
"""

from __future__ import annotations

import argparse

from retr.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser("check-reranker",
                       help="check a cross-encoder on an index's own corpus (pseudo-queries cut from its documents) "
                            "once, and store the weight searches will give it")
    p.add_argument("index", help="index folder written by `retr index`")
    p.add_argument("model", help="cross-encoder: a folder, or a hub id in the local Hugging Face cache")
    options.add_rerank_args(p)
    options.add_search_options(p, "check-reranker")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print(check_and_store(args.index, args.model, options.pipeline_config(args), options.rerank_config(args, args.model)))
    return 0


def check_and_store(index: str, model: str, pipeline, rerank, encoder=None, strict: bool = True) -> str:
    """Check the cross-encoder ``model`` on ``index`` where that applies, once: a check stored beside the index or
    in the cache is read (``retr.eval.pseudo.check_index_reranker``, the path `retr eval` and `retr serve` take),
    and stored beside the index (``<index>/rerank-checks/``: a copy of the index keeps it). Returns the line that
    says the weight searches will give it. ``encoder``: the query encoder's options (`retr serve`'s);
    ``strict``: a check that cannot be stored beside the index is an error, else a warning (the cache holds it)."""
    from dataclasses import asdict, replace

    from retr.eval.pseudo import check_index_reranker
    from retr.eval.table import reranker_line
    from retr.indexes.shards import open_index
    from retr.retrieval.compose import IndexParts
    from retr.retrieval.encoder import EncoderConfig
    from retr.retrieval.pipeline import PipelineConfig
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    opened = open_index(index)
    try:
        parts = IndexParts(opened, None, encoder or EncoderConfig())
        reranker = CrossEncoderReranker(replace(rerank, model=model) if rerank else RerankConfig(model=model))
        if parts.dense_model_hash is not None and reranker.needs_check(parts.corpus_sha256):
            check_index_reranker(opened, parts.encoder, reranker, pipeline or PipelineConfig(), strict=strict)
        weight = parts.rerank_weight(reranker)
    finally:
        opened.close()
    line = reranker_line({"weight": weight.weight, "weight_source": weight.source,
                          "corpus_check": asdict(weight.check) if weight.check else None}).strip()
    why = {"given": "--rerank-alpha given: nothing to check",
           "trained": "trained on this corpus (or not by retr): its trained weight, nothing to check",
           "unchecked": "not checked: --no-rerank-check, or the corpus is too short to cut pseudo-queries from"}
    return f"{model} on {index}: {line}" + (f" ({why[weight.source]})" if weight.source in why else "")
