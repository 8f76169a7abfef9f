"""From torch to a checked graph: export (dynamic batch and sequence axes), conversion (int8, OpenVINO IR),
and the agreement of a graph with the torch model it came from.

A graph kind (``EMBEDDING``: a sentence-transformers bi-encoder, ids + mask -> normalised vector;
``SCORING``: a cross-encoder, ids + mask + token types -> one logit) knows how to export and how to check.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.backends import quantize, sample_texts
from retr.retrieval.backends.batching import hash_rows, run_sorted
from retr.retrieval.backends.direct import GraphReference, build_embedding, embed_in_batches
from retr.retrieval.backends.quiet import quiet_third_party, vendor_telemetry_off
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

CHECK_TEXTS = (
    "a",
    "What causes the northern lights?",
    "Mitochondria are membrane-bound organelles that generate most of the chemical energy needed to power the "
    "cell's biochemical reactions. Chemical energy produced by the mitochondria is stored in ATP.",
    "BM25 ranks documents by term frequency, inverse document frequency and length normalisation; dense "
    "retrieval embeds queries and documents into one vector space. " * 6,
    "short query",
    "Zero-shot evaluation on heterogeneous benchmarks.",
)


# -- export ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def eager_attention(hf_model, on: bool = True) -> Iterator[None]:
    """``hf_model`` computing attention as plain matmuls and softmax (transformers' eager attention) while it is
    exported, its own attention back after. TorchScript's export of torch's SDPA attention is a decomposed graph
    (masking through IsNaN/Select) that OpenVINO does not fuse; the eager graph becomes OpenVINO's fused attention
    (a "Subgraph" node). Measured on an AMX Xeon, one thread, alternating (benchmarks/attention_export.py): MiniLM
    in bf16, 32 x 256 tokens 516 against 718 ms (1.39x), a 16-token query 1.90 against 1.95 ms; in fp32 1.25x at
    32 x 256; the SciFact cross-encoder, 10 x 128 pairs, 58.0 against 62.5 ms (README, "Graphs with fused
    attention"). The same function: fp32 outputs within 2.5e-7, bf16 ones within its rounding. A model without a
    settable implementation is exported as it is; so is any model with ``on`` False (the benchmark times both)."""
    setter = getattr(hf_model, "set_attn_implementation", None)
    before = getattr(getattr(hf_model, "config", None), "_attn_implementation", None)
    switched = False
    if on and setter is not None and before not in (None, "eager"):
        try:
            setter("eager")
            switched = True
        except (ValueError, ImportError, AttributeError) as e:  # an architecture without eager attention
            logger.debug("exported with %s attention: %s", before, e)
    try:
        yield
    finally:
        if switched:
            setter(before)


def _pooling_mode(st_model) -> str:
    """The pooling of a Transformer + Pooling (+ Normalize) model: mean or CLS; a ``RetrError`` for any other."""
    names = [type(m).__name__ for m in st_model]
    if names[:2] != ["Transformer", "Pooling"] or names.count("Pooling") != 1 \
            or any(n not in ("Transformer", "Pooling", "Normalize") for n in names):
        raise RetrError(f"ONNX export supports Transformer + Pooling (+ Normalize) models, not {names}")
    cfg = st_model[1].get_config_dict()
    mode = cfg.get("pooling_mode")
    if mode is None:  # sentence-transformers < 6 keeps one flag per mode
        mode = "cls" if cfg.get("pooling_mode_cls_token") else "mean" if cfg.get("pooling_mode_mean_tokens") else None
    if mode not in ("mean", "cls"):
        raise RetrError(f"ONNX export supports mean or CLS pooling, not {mode!r}")
    return mode


def export_embedding(st_model, path: Path, eager: bool = True) -> None:
    """Export transformer + pooling + normalisation to ``path`` with dynamic batch/sequence axes."""
    import torch

    mode = _pooling_mode(st_model)
    hf = st_model[0].auto_model.eval()

    class Embed(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):  # (B, L) int64 each -> (B, D) float32
            h = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, D)
            if mode == "cls":
                emb = h[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, L, 1)
                emb = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, D)
            return torch.nn.functional.normalize(emb, dim=-1)

    ex = st_model.tokenizer(["hello world", "a somewhat longer example sentence"], return_tensors="pt", padding=True)
    with eager_attention(hf, eager):
        torch_export(Embed(hf).eval(), ex, ["input_ids", "attention_mask"], "sentence_embedding", path)


def export_scoring(ce_model, path: Path, eager: bool = True) -> None:
    """Export a sentence-transformers CrossEncoder's model to ``path``: (ids, mask, types) -> one logit each."""
    import torch

    hf = ce_model.model.eval()

    class Score(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # (B, L) int64 each -> (B,) float32
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).logits[:, 0]

    ex = ce_model.tokenizer([("a query", "a document"), ("another query", "a somewhat longer document text")],
                            return_tensors="pt", padding=True, return_token_type_ids=True)
    with eager_attention(hf, eager):
        torch_export(Score(hf).eval(), ex, ["input_ids", "attention_mask", "token_type_ids"], "score", path)


def torch_export(module, example, input_names: list[str], output_name: str, path: Path) -> None:
    """torch.onnx export with dynamic batch and sequence axes on every input: TorchScript's exporter where it
    works (MiniLM: 1.5 s, against 9.1 s for dynamo on a first run, the same outputs; the graph is verified against
    torch either way), else dynamo's."""
    try:
        _onnx_export(module, example, input_names, output_name, path, dynamo=False)
    except Exception as e:  # noqa: BLE001 - an architecture TorchScript cannot trace, or an exporter gone
        logger.debug("TorchScript export failed (%s): exporting with dynamo", str(e).splitlines()[0][:200])
        for f in path.parent.glob(f"{path.name}*"):
            f.unlink()
        _onnx_export(module, example, input_names, output_name, path, dynamo=True)


def _onnx_export(module, example, input_names: list[str], output_name: str, path: Path, dynamo: bool) -> None:
    import torch

    if dynamo:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=4096)
        axes = {"dynamic_shapes": {n: {0: batch, 1: seq} for n in input_names}, "verbose": False}
    else:
        axes = {"dynamic_axes": {n: {0: "batch", 1: "seq"} for n in input_names}, "opset_version": 17}
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, tuple(example[n] for n in input_names), str(path), dynamo=dynamo,
                              input_names=input_names, output_names=[output_name], **axes)
    finally:
        exporter_log.setLevel(level)


# -- conversion: fp32 ONNX graph -> the backend's graph file ----------------------------------------------------
# how static int8 graphs are made, part of every calibration's digest (so of the cached graph's name and of the
# GraphId that keys embeddings made with it): 1, torch's export quantised; 2, a BERT bi-encoder's graph built from
# its weights (``direct``) quantised with its pooled vector kept out of int8 (no torch on a first run); 3, retr's
# own quantisation (``quantize``) in place of NNCF's
STATIC_INT8_PROCEDURE = 3


@dataclass(frozen=True)
class Calibration:
    """Texts (token ids; a cross-encoder's pairs also their token types) a static int8 graph is calibrated on;
    ``digest`` names the cached graph."""
    rows: tuple[tuple[int, ...], ...]
    digest: str
    types: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def of(cls, token_rows, type_rows=None) -> Calibration:
        """All of ``token_rows`` (retr's fixed sample, tokenised by the model: one calibration per model), with
        ``type_rows`` for a cross-encoder's pairs."""
        rows = tuple(tuple(int(t) for t in r) for r in token_rows)
        types = tuple(tuple(int(t) for t in r) for r in type_rows) if type_rows is not None else None
        h = hashlib.sha256(f"procedure {STATIC_INT8_PROCEDURE}|".encode())
        hash_rows(h, rows)
        hash_rows(h, types or (), b"t")
        return cls(rows, h.hexdigest(), types)

    def feeds(self):
        for i, r in enumerate(self.rows):  # one text per feed: no padding in the statistics
            ids = np.asarray([r], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if self.types is not None:
                feed["token_type_ids"] = np.asarray([self.types[i]], dtype=np.int64)
            yield feed


def _drop(src) -> None:
    """The fp32 graph and its external data file, once converted into another file (nothing for a model in
    memory)."""
    if isinstance(src, (str, Path)):
        for f in Path(src).parent.glob(f"{Path(src).name}*"):
            f.unlink()


def keep_onnx(src: Path, dst: Path, calibration: Calibration | None) -> None:
    os.replace(src, dst)  # its external data file keeps the name the graph refers to


# how dynamic int8 graphs are made (``quantize_dynamic_int8``), the precision they name (``DYNAMIC_INT8``): a graph
# made otherwise is made again. Every weight MatMul in int8 added MiniLM's queries ranking noise 0.0500 against
# fp32 and cost SciFact hybrid+rerank 0.0039 nDCG@10 (test) and dense 0.0035 (train); with the down-projections
# kept fp32: 0.0362, 0.0006 and 0.0018 (docs/studies/measured-choices-amx.md)
DYNAMIC_INT8 = "int8+fp32-down"


def down_projections(src: Path) -> list[str]:
    """The MatMul nodes of an ONNX graph that multiply by a constant weight with more input than output features:
    a transformer's feed-forward output (1536 -> 384 in MiniLM; a cross-encoder's head is a Gemm, never quantised).
    Their input follows GELU, whose outliers a dynamic per-tensor int8 scale resolves worst."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)  # shapes are in the graph; the weights are not needed
    weights = {w.name: tuple(w.dims) for w in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and len(n.input) == 2
            and len(weights.get(n.input[1], ())) == 2 and weights[n.input[1]][0] > weights[n.input[1]][1]]


def quantize_dynamic_int8(src: Path, dst: Path, calibration: Calibration | None, exclude: list[str] | None = None,
                          keep: bool = False) -> None:
    """The onnx-int8 graph: ``src`` in dynamic int8 at ``dst``, per-channel weights, the MatMuls by a weight only
    (embeddings and norms stay fp32), the nodes named in ``exclude`` (default: the down-projections,
    ``down_projections``) left fp32; ``src`` removed unless ``keep``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_third_party("onnxruntime"):
        quantize_dynamic(str(src), str(dst), per_channel=True, op_types_to_quantize=["MatMul"],
                         weight_type=QuantType.QInt8, extra_options={"MatMulConstBOnly": True},
                         nodes_to_exclude=down_projections(src) if exclude is None else exclude)
    if not keep:
        _drop(src)


def read_graph(src, own: bool = False):
    """An OpenVINO model from a graph file, or ``src`` itself where it is one already (built from the weights);
    ``own``: a model to change (a built model given in memory is the checks' reference after a conversion, so it
    is changed in a copy)."""
    vendor_telemetry_off()
    import openvino as ov

    if isinstance(src, (str, Path)):
        return ov.Core().read_model(str(src))
    return src.clone() if own else src


def to_openvino(src, dst: Path, calibration: Calibration | None, model=None) -> None:
    """``model`` (default: the graph ``src``) saved as OpenVINO IR at ``dst``, and ``src`` dropped (``_drop``)."""
    vendor_telemetry_off()
    import openvino as ov

    ov.save_model(read_graph(src) if model is None else model, str(dst), compress_to_fp16=False)
    _drop(src)


# ``compress_int8_weights``: OpenVINO quantises the activations in groups of this many values along each row (its
# default: 32). 2,000 SciFact documents through MiniLM's graph on 2 cores of an AMX Xeon with AMX refused,
# alternating: 38.4 / 37.7 s in groups of 32, 30.6 / 30.9 in 64, 29.2 / 28.6 and 33.9 / 28.7 in 128, 37.4 / 34.1
# in 384 (one group a row). Documents through it against fp32, nDCG@10 on five collections: the largest loss
# 0.0012 in groups of 32, 0.0019 in 64, 0.0034 in 128 (NPL hybrid; see
# benchmarks/results/int8w-documents-quality-noamx-xeon.json): 64, the fastest within the 0.002 a faster graph is
# held to
WEIGHTS_INT8_GROUP = 64


def compress_int8_weights(src, dst: Path, calibration: Calibration | None) -> None:
    """The graph with every fixed 2-D MatMul weight stored as int8, symmetric per output channel (scale: the row's
    largest |w| / 127), and dequantised in the graph (int8 -> Convert -> Multiply by the row's scale), the pattern
    OpenVINO's CPU plugin runs as int8 weights with the activations quantised at run time (in groups of
    ``WEIGHTS_INT8_GROUP``): no calibration sample, made in ~0.05 s for MiniLM. Measured there against NNCF's
    ``compress_weights`` (INT8_SYM), on retr's sample passages (groups of 32): cosine to fp32 >= 0.9984 against
    0.9975, the same speed (the MatMul weights alone are touched; embeddings, layer norms and the attention
    products stay as they are)."""
    model = read_graph(src, own=True)
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul" or not node.get_attributes().get("transpose_b"):
            continue
        weight = node.input_value(1).get_node()
        if weight.get_type_name() != "Constant" or len(weight.get_output_shape(0)) != 2:
            continue
        # (out, in): x @ W.T
        node.input(1).replace_source_output(quantize.int8_weight(weight.get_data().astype(np.float32), 1).output(0))
    # the activations' quantisation groups travel with the graph (OpenVINO reads ``runtime_options`` at compile time)
    model.set_rt_info(str(WEIGHTS_INT8_GROUP), ["runtime_options", "DYNAMIC_QUANTIZATION_GROUP_SIZE"])
    to_openvino(src, dst, calibration, model)


def quantize_static_int8(src, dst: Path, calibration: Calibration | None,
                         feed_forward_only: bool = False, seen=None) -> None:
    """Static int8 MatMuls (``quantize.quantize``: SmoothQuant, ranges measured on ``calibration``) of a graph,
    saved as OpenVINO IR. ``seen``: given each calibration feed and the graph's own output for it."""
    if calibration is None:
        raise RetrError("static int8 needs a calibration sample")
    model = read_graph(src, own=True)
    # the pooled sentence vector before its L2 normalisation is never quantised (only MatMuls' inputs are): NNCF,
    # which quantised it where a graph built from the weights offers it, cost MiniLM's int8 graph cosine 0.966 to
    # its reference on a one-word text against 0.991 without
    to_openvino(src, dst, calibration, quantize.quantize(model, list(calibration.feeds()), feed_forward_only, seen))


# -- agreement with torch ----------------------------------------------------------------------------------------
def ce_logits(model, pairs: list[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
    """A sentence-transformers CrossEncoder's raw logits (its own default applies a sigmoid): the score every
    retr backend returns, so exported graphs, training dev scores and interpolation agree."""
    import torch

    scores = model.predict(pairs, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True,
                           activation_fn=torch.nn.Identity())
    return np.asarray(scores, dtype=np.float32).reshape(-1)


class TorchEmbedding:
    """A sentence-transformers model as the reference an exported graph is checked against: its embeddings and
    its tokenizer's padded batches (what ``direct.NumpyBert`` offers for a graph built from the weights)."""

    def __init__(self, st_model):
        self.st_model = st_model

    def feed(self, texts: list[str], max_length: int) -> dict[str, np.ndarray]:
        e = self.st_model.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        return {"input_ids": e["input_ids"].astype(np.int64), "attention_mask": e["attention_mask"].astype(np.int64)}

    def embed(self, texts: list[str], max_length: int) -> np.ndarray:
        """Normalised embeddings (truncated at the model's own max length, which the encoder set to ``max_length``)."""
        import torch

        with torch.inference_mode():
            return self.st_model.encode(texts, convert_to_numpy=True, normalize_embeddings=True,
                                        show_progress_bar=False)


def verify_embedding(runner, reference, max_length: int) -> float:
    """Min cosine between the graph's embeddings and the reference's (``TorchEmbedding``, or ``direct.NumpyBert``
    for a graph built from the weights) on one padded mixed-length batch and on singles."""
    texts = list(CHECK_TEXTS)
    want = reference.embed(texts, max_length)
    batched = runner(reference.feed(texts, max_length))
    singles = np.stack([runner(reference.feed([t], max_length))[0] for t in texts[:3]])
    return float(min((batched * want).sum(1).min(), (singles * want[:3]).sum(1).min()))


def verify_scoring(runner, ce_model, max_length: int) -> float:
    """Agreement of the graph's and torch's cross-encoder scores on a padded mixed-length batch and on singles:
    1 - max |difference| / max(1, range of the torch scores)."""
    pairs = [(q, d) for q in CHECK_TEXTS[1:3] for d in CHECK_TEXTS]
    ref = ce_logits(ce_model, pairs, batch_size=len(pairs))

    def scores(batch):
        enc = ce_model.tokenizer(batch, padding=True, truncation=True, max_length=max_length, return_tensors="np",
                                 return_token_type_ids=True)
        return runner({k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})

    got = np.concatenate([scores(pairs), *[scores([p]) for p in pairs[:3]]]).reshape(-1)
    want = np.concatenate([ref, ref[:3]])
    return float(1.0 - np.abs(got - want).max() / max(1.0, float(np.ptp(ref))))


def rank_noise(runner, reference, max_length: int) -> float:
    """How far the graph's document vectors move retrieval scores, relative to how widely the scores spread:
    retr's fixed questions (the reference's vectors) against its fixed passages and joined passages
    (``sample_texts``) encoded by the reference (``verify_embedding``'s) and by the graph, the mean over questions
    of std(graph score - reference score) / std(reference score). Ranks swap where noise meets the gaps between
    scores, so this predicts a graph's ranking loss where a per-vector cosine does not: a fine-tuned model can keep
    every cosine above 0.98 and still lose nDCG."""
    docs = sample_texts.passages() + sample_texts.long_passages()
    q = reference.embed(sample_texts.questions(), max_length)
    ref = reference.embed(docs, max_length)
    # the encoding's own runner (every graph is checked on it): its streams at once, on the requests its encoding
    # then uses (~1.3 s against ~2.5 s one call at a time on MiniLM's int8-weights graph, 2 cores); a runner with
    # one stream (ONNX Runtime's, or OpenVINO's on one core) one call a batch, beside its single-call request
    got = embed_in_batches(runner, reference.feed, docs, max_length, streams=getattr(runner, "parallel", 1) > 1)
    return pair_noise(q @ ref.T, q @ got.T)  # each question's scores of every passage


NOISE_QUESTIONS = 8  # cross-encoders: questions scored against every sample passage (torch is the slow side)


def pair_noise(reference, got) -> float:
    """std(score - reference score) / std(reference score) per query, averaged: how far a graph's scores of each
    query's documents move against the spread that orders them (a model scoring all alike: no spread, refused).
    ``reference`` and ``got``: one row of scores per query (a list of arrays, or a 2-D array). The one formula of
    every ranking-noise check: documents (``rank_noise``), queries (``QueryGraphs.noise``), pairs."""
    return float(np.mean([float((g - r).std() / max(float(r.std()), 1e-12))
                          for r, g in zip(reference, got, strict=True)]))


def score_noise(runner, ce_model, max_length: int) -> float:
    """``rank_noise`` for a cross-encoder: the first ``NOISE_QUESTIONS`` of retr's fixed questions, each scored
    against every fixed passage and joined passage by torch and by the graph; the mean over questions of
    std(graph score - torch score) / std(torch score)."""
    docs = sample_texts.passages() + sample_texts.long_passages()
    refs, gots = [], []
    for q in sample_texts.questions()[:NOISE_QUESTIONS]:
        pairs = [(q, d) for d in docs]
        refs.append(ce_logits(ce_model, pairs))
        enc = ce_model.tokenizer(pairs, truncation=True, max_length=max_length, padding=False,
                                 return_token_type_ids=True)
        gots.append(run_sorted(runner, enc["input_ids"], 16 * max_length, np.empty_like(refs[-1]),  # ~16 a batch
                               extra_rows={"token_type_ids": enc["token_type_ids"]}))
    return pair_noise(refs, gots)


def embedding_dim(runner) -> int:
    return int(runner({"input_ids": np.array([[1, 2]], dtype=np.int64),
                       "attention_mask": np.ones((1, 2), dtype=np.int64)}).shape[1])


@dataclass(frozen=True)
class GraphKind:
    """What a graph computes: how to export it from its torch model and how to check it against that model."""
    name: str  # "bi" | "ce": the key of a backend's agreement floors
    label: str  # for messages
    measure: str  # what the check reports
    folder_tag: str  # in the cache folder's name
    export: Callable[[object, Path], None]
    verify: Callable[[object, object, int], float]
    dim: Callable[[object], int]
    # (runner, reference, max length) -> ranking noise, checked where a backend sets ``max_rank_noise``
    rank_noise: Callable[[object, object, int], float] | None = None
    reference: Callable[[object], object] = lambda model: model  # the torch model -> what verify checks against
    # a model's folder -> its graph built from the weights and that graph's reference (``direct.Built``), or None:
    # exported from torch
    build: Callable[[Path], object] | None = None
    # (a verified fp32 graph's runner, the model's folder, its dimension, its known vectors: ``Graph.known``) -> that
    # graph as the reference of an int8 graph made from it (``direct.GraphReference``); None: such a graph is
    # checked as any other
    graph_reference: Callable[[object, Path, int, dict], object] | None = None
    # the texts ``verify`` runs through the reference: kept by a graph reference before a calibration, whose
    # statistics pass gives the rest (``graphs.load_or_export``)
    check_texts: tuple[str, ...] = ()


EMBEDDING = GraphKind("bi", "bi-encoder", "cosine", "", export_embedding, verify_embedding, embedding_dim, rank_noise,
                      TorchEmbedding, build_embedding, GraphReference, CHECK_TEXTS)
SCORING = GraphKind("ce", "cross-encoder", "agreement", "ce-", export_scoring, verify_scoring, lambda _runner: 1,
                    score_noise)
