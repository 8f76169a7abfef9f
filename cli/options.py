"""Argument types and the option groups several subcommands share; every default and choice comes from the
config it fills (the CLI declares none of its own)."""

from __future__ import annotations

import argparse

from retr.eval.metrics import DEFAULT_K_VALUES, MAX_CUTOFF
from retr.indexes.dense import KINDS, DenseIndexConfig
from retr.indexes.executors import EXECUTORS, ExecutorConfig
from retr.retrieval.backends.registry import DEFAULT_BACKEND, DEFAULT_RERANK_BACKEND, SCORING, choices
from retr.retrieval.encoder import EncoderConfig
from retr.retrieval.errors import RetrError
from retr.retrieval.focus import INPUT_FORMS
from retr.retrieval.fusion import FUSIONS
from retr.retrieval.passages import AGGREGATES, DEFAULT_AGGREGATE
from retr.retrieval.pipeline import PipelineConfig
from retr.retrieval.rerank import DEFAULT_RERANK_DEPTH, DEFAULT_RERANK_MAX_LENGTH
from retr.retrieval.sparse import ENGINES as SPARSE_ENGINES

_DENSE = DenseIndexConfig()
_EXECUTOR = ExecutorConfig()
_ENCODER = EncoderConfig()
_PIPELINE = PipelineConfig()


def _int_at_least(text: str, least: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= {least}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0)


def fusion_depth(text: str) -> int:
    """A hybrid's fusion depth: 1 to ``MAX_K`` (a request's bound on hits, as the API and the service check it)."""
    from retr.retrieval.request import MAX_K

    v = _int_at_least(text, 1)
    if v > MAX_K:
        raise argparse.ArgumentTypeError(f"{text!r} must be <= {MAX_K}")
    return v


def add_k_values_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k-values", type=k_values, default=DEFAULT_K_VALUES, metavar="K[,K...]",
                   help="cut-offs of the metrics (nDCG@k, Recall@k, ...), comma-separated")


def k_values(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: k values are comma-separated integers") from None
    if not ks or ks[0] < 1 or ks[-1] > MAX_CUTOFF:
        raise argparse.ArgumentTypeError(f"{text!r}: k values must be from 1 to {MAX_CUTOFF:,}")
    return ks


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="bi-encoder: a sentence-transformers folder or hub id (default: bundled all-MiniLM-L6-v2)")
    p.add_argument("--max-length", type=positive_int, default=None, help="encoder max tokens (default: model's)")
    p.add_argument("--batch-size", type=positive_int, default=_ENCODER.batch_size, help="texts per batch (torch)")
    add_backend_arg(p)
    add_query_prompt_arg(p)
    p.add_argument("--doc-prompt", default=None,
                   help="text put before every document (default: the model's own, from its sentence-transformers "
                        "config; '' for none); recorded in the index")


def add_query_prompt_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--query-prompt", default=None,
                   help="text put before every query (default: the model's own; '' for none); an index refuses "
                        "queries with another prompt than it was built for")


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=choices(), default=DEFAULT_BACKEND, metavar="NAME",
                   help="bi-encoder inference: %(choices)s; every graph is checked against torch")


def add_query_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--query-backend", choices=choices(), default=None, metavar="NAME",
                   help="query encoding: %(choices)s (default: --backend, in its base precision where it is "
                        "calibrated; onnx-int8 encodes a lone query ~2x faster at some cost in quality)")


def add_rerank_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rerank-depth", type=positive_int, default=DEFAULT_RERANK_DEPTH,
                   help=f"first-stage hits the cross-encoder rescores (default: {DEFAULT_RERANK_DEPTH}, chosen on dev "
                        f"by quality per ms)")
    p.add_argument("--rerank-max-length", type=positive_int, default=None,
                   help=f"tokens of (query, document) the cross-encoder reads (default: the length it was trained "
                        f"at, else {DEFAULT_RERANK_MAX_LENGTH})")
    p.add_argument("--rerank-inputs", choices=tuple(INPUT_FORMS), default=None,
                   help="what the cross-encoder reads of a document: its head, or its sentences sharing most query "
                        "terms (default: the form it was trained on, else head)")
    p.add_argument("--rerank-backend", choices=choices(SCORING), default=None, metavar="NAME",
                   help=f"cross-encoder inference: %(choices)s; every graph is checked against torch (default: "
                        f"measured here: {DEFAULT_RERANK_BACKEND}, or another of the model's graphs already in the "
                        f"cache where it scores a query's pairs faster within the noise bound; `retr doctor --rerank "
                        f"MODEL` shows them)")
    p.add_argument("--rerank-alpha", type=float, default=None,
                   help="cross-encoder weight vs the first stage (default: chosen on dev at training, else 1; on "
                        "a corpus it was not trained on, capped by the reranker check)")
    p.add_argument("--no-rerank-check", dest="rerank_check", action="store_false",
                   help="on a corpus the cross-encoder was not trained on, do not check it on pseudo-queries cut "
                        "from the corpus (the check caps its weight there; measured once per corpus, then cached)")


def add_fusion_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fusion", choices=FUSIONS, default=_PIPELINE.fusion,
                   help="hybrid: how the BM25 and dense rankings are fused (minmax, zscore: normalised scores "
                        "summed; rrf: reciprocal rank fusion)")
    p.add_argument("--fusion-depth", type=fusion_depth, default=_PIPELINE.fusion_depth,
                   help="hybrid: the top hits of BM25 and of dense whose scores set each list's normalisation (each "
                        "list is still searched to k where k is larger)")
    p.add_argument("--sparse-engine", choices=SPARSE_ENGINES, default=_PIPELINE.sparse_engine,
                   help="splade, hybrid3: how the sparse part is searched (exact: CSR dot products; seismic: "
                        "approximate, pyseismic-lsr)")
    p.add_argument("--multivector-model", default=None, metavar="MODEL",
                   help="+maxsim: the multi-vector (ColBERT-style) encoder that rescores the top hits (a "
                        "MultiVectorEncoder folder or hub id; `retr train multi-vector` makes one)")
    add_passage_aggregate_arg(p, building=False)


def add_sparse_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sparse-model", default=None, metavar="MODEL",
                   help="a sentence-transformers SparseEncoder (folder or hub id in the local cache): build the "
                        "index's learned sparse part with it, for the splade and hybrid3 pipelines (default: none)")
    p.add_argument("--sparse-max-length", type=positive_int, default=None,
                   help="tokens of each text the sparse encoder reads (default: the model's own)")


def sparse_config(args):
    from retr.retrieval.sparse import SparseConfig

    model = getattr(args, "sparse_model", None)
    if not model:
        return None
    return SparseConfig(model, max_length=args.sparse_max_length,
                        engine=getattr(args, "sparse_engine", None) or _PIPELINE.sparse_engine)


def add_passage_aggregate_arg(p: argparse.ArgumentParser, building: bool) -> None:
    """How a document's score comes from its passages' scores: chosen when an index of passages is built (and
    recorded in it), and changeable for a search."""
    if building:
        p.add_argument("--passage-aggregate", choices=AGGREGATES, default=DEFAULT_AGGREGATE,
                       help="with --passages: a document's score from its passages' (maxp: the best); recorded in "
                            "the index as its default")
    else:
        p.add_argument("--passage-aggregate", choices=AGGREGATES, default=None,
                       help="an index of passages: a document's score from its passages' (maxp: the best; "
                            "default: the index's own)")


def add_passage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--passages", default=None, metavar="N[:STRIDE]",
                   help="index passages of N tokens, a new one every STRIDE (default N/2), and rank documents by "
                        "them (long documents are otherwise cut at the encoder's max length)")
    if "--passage-aggregate" not in p._option_string_actions:  # eval: the search's option chooses the build's too
        add_passage_aggregate_arg(p, building=True)


def passage_config(args):
    from retr.retrieval.passages import PassageConfig

    if not args.passages:
        return None
    return PassageConfig.parse(args.passages, args.passage_aggregate or DEFAULT_AGGREGATE)


def pipeline_config(args) -> PipelineConfig:
    return PipelineConfig(fusion=args.fusion, fusion_depth=args.fusion_depth, passage_aggregate=args.passage_aggregate,
                          sparse_engine=getattr(args, "sparse_engine", _PIPELINE.sparse_engine),
                          multivector_model=getattr(args, "multivector_model", None))


def add_index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=KINDS, default=_DENSE.kind,
                   help="FAISS index kind (lean: 4-bit IVF-PQ codes in RAM, re-scored from memory-mapped fp16 vectors)")
    p.add_argument("--hnsw-m", type=positive_int, default=_DENSE.hnsw_m, help="hnsw: neighbours of each node (M)")
    p.add_argument("--ef-construction", type=positive_int, default=_DENSE.ef_construction,
                   help="hnsw: candidates considered while linking a node at build time")
    p.add_argument("--ef-search", type=positive_int, default=_DENSE.ef_search,
                   help="hnsw: candidates considered while searching (breadth)")
    p.add_argument("--nlist", type=int, default=_DENSE.nlist, help="ivfpq, lean: IVF lists (0: ~4*sqrt(N))")
    p.add_argument("--pq-m", type=int, default=_DENSE.pq_m, help="ivfpq: PQ sub-quantizers (0: dim/8)")
    p.add_argument("--pq-nbits", type=positive_int, default=_DENSE.pq_nbits, help="ivfpq: bits of each PQ code")
    p.add_argument("--nprobe", type=positive_int, default=_DENSE.nprobe, help="ivfpq: IVF lists probed")
    p.add_argument("--lean-m", type=int, default=_DENSE.lean_m,
                   help="lean: 4-bit sub-quantizers, lean-m/2 bytes of code a vector (0: up to 64)")
    p.add_argument("--lean-nprobe", type=positive_int, default=_DENSE.lean_nprobe, help="lean: lists probed")
    p.add_argument("--k-factor", type=positive_int, default=_DENSE.k_factor,
                   help="lean: candidates re-scored from the fp16 vectors per hit asked for")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")
    p.add_argument("--shards", type=positive_int, default=1,
                   help="partition the documents by a stable hash of their id into N shard indexes; a search fans "
                        "out over them and merges (BM25 keeps the whole collection's statistics)")
    p.add_argument("--executor", choices=tuple(EXECUTORS), default=_EXECUTOR.name,
                   help="where the documents are encoded: this process, or a Ray cluster (pip install 'retr[ray]')")
    p.add_argument("--ray-address", default=None,
                   help="--executor ray: the cluster to join (auto, or HOST:PORT of its head); default: a Ray "
                        "started on this machine for the build")
    p.add_argument("--ray-actors", type=positive_int, default=_EXECUTOR.actors,
                   help="--executor ray: encoder actors (each loads the graph once)")
    p.add_argument("--ray-cpus-per-actor", type=positive_int, default=_EXECUTOR.cpus_per_actor,
                   help="--executor ray: CPUs each actor reserves (its inference threads)")


def executor_config(args) -> ExecutorConfig:
    return ExecutorConfig(name=args.executor, address=args.ray_address, actors=args.ray_actors,
                          cpus_per_actor=args.ray_cpus_per_actor)


def dense_config(args) -> DenseIndexConfig:
    return DenseIndexConfig(kind=args.kind, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction,
                            ef_search=args.ef_search, nlist=args.nlist, pq_m=args.pq_m, pq_nbits=args.pq_nbits,
                            nprobe=args.nprobe, lean_m=args.lean_m, lean_nprobe=args.lean_nprobe,
                            k_factor=args.k_factor)


def encoder_config(args, query_backend: bool = False) -> EncoderConfig:
    return EncoderConfig(model=args.model, max_length=args.max_length, batch_size=args.batch_size,
                         backend=args.backend, query_backend=args.query_backend if query_backend else None,
                         query_prompt=args.query_prompt, doc_prompt=args.doc_prompt)


def query_encoder_config(args) -> EncoderConfig:
    """The query encoder of a search over an existing index (search, serve): its model defaults to the index's."""
    return EncoderConfig(model=args.model, backend=args.backend, query_backend=args.query_backend,
                         query_prompt=args.query_prompt)


def rerank_config(args, model: str | None):
    from retr.retrieval.rerank import RerankConfig

    if not model:
        return None
    return RerankConfig(model=model, depth=args.rerank_depth, max_length=args.rerank_max_length,
                        backend=args.rerank_backend, interpolation=args.rerank_alpha,
                        corpus_check=args.rerank_check, inputs=args.rerank_inputs)



def add_bm25_args(p: argparse.ArgumentParser) -> None:
    """How BM25 scores and analyses text (``retr index``, ``retr eval``); recorded in the index's manifest."""
    from retr.retrieval.bm25 import DELTA_MAX, K1_MAX, METHODS, NO_LANGUAGE, BM25Config

    d = BM25Config()
    p.add_argument("--bm25-k1", type=float, default=d.k1,
                   help=f"BM25 term-frequency saturation k1, 0..{K1_MAX:g} (default {d.k1})")
    p.add_argument("--bm25-b", type=float, default=d.b, help=f"BM25 length normalisation b, 0..1 (default {d.b})")
    p.add_argument("--bm25-method", choices=METHODS, default=d.method,
                   help=f"BM25 variant as bm25s computes it (default {d.method}; bm25l and bm25+ add --bm25-delta)")
    p.add_argument("--bm25-delta", type=float, default=d.delta,
                   help=f"bm25l / bm25+: the delta added to each matching term, 0..{DELTA_MAX:g} (default {d.delta})")
    p.add_argument("--bm25-language", default=d.language, metavar="LANG",
                   help=f"Snowball stemmer (PyStemmer: german, french, spanish, ...) with bm25s's stopword list where "
                        f"it has one for the language; '{NO_LANGUAGE}': neither (default {d.language})")


def bm25_config(args):
    from retr.retrieval.bm25 import BM25Config

    return BM25Config.for_language(args.bm25_language, k1=args.bm25_k1, b=args.bm25_b, method=args.bm25_method,
                                   delta=args.bm25_delta)


def check_out(out: str | None, folders: dict | None = None, **files) -> None:
    """``artifacts.check_output`` for a command's ``--out``: never one of its input ``files``, never inside its
    input ``folders`` (a dataset's, an index's), and writable; checked before any work."""
    from retr.retrieval.artifacts import check_output

    check_output(out, "--out", files, folders)


def check_run_dir(run_dir) -> None:
    """A one-line error, before any work, where the run files' folder is a file."""
    import os

    if run_dir is not None and os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise RetrError(f"{run_dir}: the run files' folder (--run-dir) is a file: give a folder path")
