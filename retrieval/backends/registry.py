"""Every inference backend as one value: adding a backend is one entry here plus its runner.

Each list of choices (the CLI's, the configs' checks, the reranker's) is derived from ``BACKENDS``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from retr.retrieval.backends import export
from retr.retrieval.backends.export import EMBEDDING, SCORING, GraphKind
from retr.retrieval.backends.platform import Platform, this_platform
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backend:
    name: str
    help: str
    runtime: str  # "torch", or a key of runners.RUNTIMES
    file: str | None = None  # the graph file in its cache folder (None: torch, nothing exported)
    # minimum agreement with torch per graph kind (bi-encoder: min cosine; cross-encoder: 1 - max |diff| / range);
    # a kind not listed is not offered by this backend
    floors: Mapping[str, float] = field(default_factory=dict)
    # (fp32 onnx file, graph file, calibration) -> None; a calibrated backend's also takes ``seen``: given each
    # calibration feed and the fp32 graph's output for it (``quantize.quantize``)
    convert: Callable | None = None
    precision: Callable[[], str] = lambda: "fp32"  # the arithmetic it runs in on this machine
    base: str | None = None  # calibrated on a corpus: the backend for any other text (and for small corpora)
    batch_invariant: bool = True  # False: a text's output depends on the batch it is in (dynamic int8)
    # most ranking noise a graph may add per graph kind (GraphKind.rank_noise); a kind not listed: not checked
    max_rank_noise: Mapping[str, float] = field(default_factory=dict)
    int8: bool = False  # made from the base graph by quantising it: checked against that graph where it was built
    # calibrated: the uncalibrated int8 graph a corpus too small to pay the calibration goes through, where int8 runs
    # here and that graph is measured faster than the base graph (``CorpusPlanner``)
    uncalibrated: str | None = None
    queries: bool = True  # offered as a query candidate (``QueryGraphs.candidates``)

    @property
    def calibrated(self) -> bool:
        return self.base is not None

    @property
    def exported(self) -> bool:
        return self.runtime != "torch"

    def supports(self, kind: GraphKind) -> bool:
        return not self.exported or kind.name in self.floors

    def floor(self, kind: GraphKind) -> float:
        return self.floors[kind.name]

    def noise_bound(self, kind: GraphKind) -> float | None:
        return self.max_rank_noise.get(kind.name)


# static int8 documents: the most ranking noise (export.rank_noise) a model's calibrated graph may add, else its
# corpora are encoded by the base graph. A guard against broken graphs, not a measured noise -> loss bound: int8
# adds ~0.037 for MiniLM and for a SciFact-trained model alike, though only the latter loses nDCG (README, "int8
# and its check")
MAX_RANK_NOISE = 0.05
# cross-encoders (export.score_noise): a SciFact-trained cross-encoder's static int8 graph adds 0.119 and reranks as
# its bf16 graph does (SciFact dev and test, README "Reranking within a budget"); a broken graph adds ~1
CE_MAX_RANK_NOISE = 0.2
# the least agreement with torch (1 - max |difference| / range) of a cross-encoder's int8 graph. Dynamic: the
# bar it always had. Static: a guard only (the same trained model measures 0.816; its ranking check is the noise)
CE_INT8_FLOOR = 0.95
CE_STATIC_INT8_FLOOR = 0.7


def _static_int8(name: str, help_: str, convert: Callable) -> Backend:
    """A backend of static int8 OpenVINO graphs, calibrated once per model and checked for ranking noise."""
    return Backend(name, help_, "openvino", "model.xml", {"bi": 0.98, "ce": CE_STATIC_INT8_FLOOR}, convert,
                   lambda: f"int8+{this_platform().precision}", base="openvino",
                   max_rank_noise={"bi": MAX_RANK_NOISE, "ce": CE_MAX_RANK_NOISE}, int8=True,
                   uncalibrated=WEIGHTS_INT8)


# documents of a corpus too small to pay a calibration: int8 weights, activations quantised at run time. Its check
# against the fp32 graph on retr's sample: cosine >= 0.998 for MiniLM (static int8: 0.991). Not a query candidate:
# SciFact's queries through it (NNCF's equivalent) moved hybrid nDCG@10 0.7301 -> 0.7277 on an AMX Xeon with AMX
# refused (benchmarks/results/int8-query-graphs-noamx-xeon.json). It computes in fp32 on every CPU: OpenVINO
# quantises its activations to int8 in fp32 alone (asked for bf16 it decompresses the weights to bf16, no int8
# arithmetic), and in bf16 on an AMX Xeon a 2-layer BERT of hidden size 32 through it on two streams of one
# thread each gave cosine -0.11 to the same graph on one stream (OpenVINO 2026.4; MiniLM: 0.9988 either way)
WEIGHTS_INT8 = "openvino-int8w"


BACKENDS: Mapping[str, Backend] = MappingProxyType({b.name: b for b in (
    _static_int8("openvino-int8", "a corpus of calibration_min_docs+ documents (a cross-encoder: every pair) "
                 "through static int8 MatMuls calibrated once per model on retr's fixed sample (NNCF) and checked "
                 "for ranking noise, other texts as openvino; on a CPU where int8 is no faster (no AVX-512 VNNI or "
                 "AVX-VNNI; or AMX, whose bf16 is as fast), everything as openvino", export.quantize_static_int8),
    _static_int8("openvino-int8-ffn", "as openvino-int8, with int8 only in the feed-forward MatMuls (attention in "
                 "bf16/fp32): slower, closer to the base graph",
                 functools.partial(export.quantize_static_int8, feed_forward_only=True)),
    Backend(WEIGHTS_INT8, "int8 MatMul weights (symmetric, per output channel), activations quantised by OpenVINO "
            "at run time: no calibration, made from the openvino graph in well under a second (the default backend "
            "takes it for corpora too small to pay a calibration)", "openvino", "model.xml",
            {"bi": 0.99}, export.compress_int8_weights, lambda: "int8w+fp32",
            max_rank_noise={"bi": MAX_RANK_NOISE}, int8=True, queries=False),
    Backend("openvino", "OpenVINO, bf16 where the CPU has it natively, else fp32", "openvino", "model.xml",
            {"bi": 0.999, "ce": 0.98}, export.to_openvino, lambda: this_platform().precision),
    Backend("onnx", "ONNX Runtime fp32", "onnxruntime", "model.onnx", {"bi": 0.9999, "ce": 0.999}, export.keep_onnx),
    Backend("onnx-int8", "ONNX Runtime, dynamic int8 MatMuls (feed-forward down-projections fp32)", "onnxruntime",
            "model.onnx", {"bi": 0.985, "ce": CE_INT8_FLOOR}, export.quantize_dynamic_int8,
            lambda: export.DYNAMIC_INT8, batch_invariant=False),
    Backend("torch", "the torch model itself (sentence-transformers)", "torch"),
)})

# documents: static int8 (queries: the base graph, bf16 where native). Over 729 queries of five collections this
# costs MiniLM and a SciFact-trained model at most 0.0018 nDCG@10 against bf16; openvino-int8-ffn is closer to
# bf16 (at most 0.0013) but ~12% slower, under the 3x first-run goal on SciFact (README, "int8 and its check")
DEFAULT_BACKEND = "openvino-int8"
DEFAULT_RERANK_BACKEND = "openvino"


def choices(kind: GraphKind = EMBEDDING) -> tuple[str, ...]:
    return tuple(name for name, b in BACKENDS.items() if b.supports(kind))


def get_backend(name: str, kind: GraphKind = EMBEDDING) -> Backend:
    """The backend named ``name`` for a graph of ``kind``; an error listing the choices otherwise."""
    b = BACKENDS.get(name)
    if b is None or not b.supports(kind):
        raise RetrError(f"unknown {kind.label} backend {name!r}: choose one of {', '.join(choices(kind))}")
    return b


def base_of(name: str) -> Backend:
    """The backend a text takes when there is no corpus to calibrate on (itself, unless calibrated)."""
    b = get_backend(name)
    return BACKENDS[b.base] if b.calibrated else b


def on_this_cpu(backend: Backend, kind: GraphKind = EMBEDDING, platform: Platform | None = None) -> Backend:
    """The backend that does ``backend``'s work on ``platform`` (default: this machine): itself, or its base where
    it cannot run natively there (static int8 without int8 dot products: ``chooser.prune``), said once per process
    in an info line. Whether a corpus then pays for a calibration is measured (``cost.calibration_pays``)."""
    platform = platform or this_platform()
    if backend.base is None or platform.static_int8:
        return backend
    _say_base(backend.name, backend.base, kind.label, platform.precision)
    return get_backend(backend.base, kind)


@functools.cache
def _say_base(name: str, base: str, label: str, precision: str) -> None:
    logger.info("the %s runs the %s graph (%s) here, not %s: this CPU has no int8 dot-product instructions "
                "(AVX-512 VNNI, AVX-VNNI or AMX), so int8 would only be emulated", label, base, precision, name)


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "DEFAULT_RERANK_BACKEND", "EMBEDDING", "SCORING", "Backend", "base_of",
           "choices", "get_backend", "on_this_cpu"]
