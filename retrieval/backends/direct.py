"""A BERT bi-encoder's OpenVINO graph built straight from its weights, and a numpy forward pass to check it by.

Exporting a graph from torch costs a first run the imports of torch, transformers and sentence-transformers, the
model's load and TorchScript's trace (measured on a 2-core AMX Xeon: ~7 s of an 18.9 s first `retr index` of 1,000
documents). A BERT encoder (``model_type`` bert: MiniLM, BGE, E5, GTE and most sentence-transformers models) is a
short, fixed computation, so retr writes its graph from ``model.safetensors`` with OpenVINO's own operations
(attention as the matmuls and softmax OpenVINO fuses, layer norms as ``MVN``) in ~0.4 s, and checks it, as an
export is checked, against an independent computation of the same model: ``NumpyBert``, a plain numpy forward pass
of the weights (itself checked against torch and sentence-transformers by the tests, on a random BERT and MiniLM).
Whatever this module does not know (another architecture, activation or position embedding, pooling other than
mean or CLS, a module after the pooling, weights not in safetensors or in bf16) takes the torch export, and so do
static int8 graphs (``graphs.load_or_export``) and cross-encoders.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.backends import batching

logger = logging.getLogger(__name__)

# hidden_act -> OpenVINO's Gelu mode (HF: "gelu" is erf's; "gelu_new" and "gelu_pytorch_tanh" the tanh form)
ACTIVATIONS = {"gelu": "erf", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class BertSpec:
    """What the graph is built from: the transformer's folder and the few numbers that shape it."""
    folder: Path  # config.json and model.safetensors
    layers: int
    hidden: int
    heads: int
    eps: float
    activation: str  # a value of ACTIVATIONS
    positions: int  # max_position_embeddings
    pooling: str  # "mean" | "cls"
    intermediate: int  # the feed-forward width

    def macs_per_token(self, length: float) -> float:
        """Multiply-adds a token costs in a text of ``length`` tokens: each layer's four attention projections and
        two feed-forward matrices, and its attention's two products (scores, then values) over the text."""
        h = self.hidden
        return self.layers * (4 * h * h + 2 * h * self.intermediate + 2 * length * h)


def _json(path: Path) -> dict:
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def _pooling(folder: Path) -> str | None:
    cfg = _json(folder / "config.json")
    mode = cfg.get("pooling_mode")
    if mode is None:  # sentence-transformers < 6 keeps one flag per mode
        flags = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
        mode = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}.get(flags[0]) \
            if len(flags) == 1 else None
    return mode if mode in ("mean", "cls") else None


def bert_spec(model_path: Path) -> BertSpec | None:
    """The spec of a sentence-transformers BERT bi-encoder at ``model_path`` (Transformer + mean or CLS Pooling
    + Normalize), or None (with the reason at debug level): its graph then comes from torch."""
    def no(why: str) -> None:
        logger.debug("%s: graph exported from torch (%s)", model_path, why)
        return None

    try:
        modules = json.loads((model_path / "modules.json").read_text())
        names = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
        if names[:2] != ["Transformer", "Pooling"] or any(n not in MODULES for n in names):
            return no(f"modules {names}")
        folder = model_path / modules[0].get("path", "")
        pooling = _pooling(model_path / modules[1]["path"])
        cfg = _json(folder / "config.json")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return no(f"not a sentence-transformers folder retr knows: {e}")
    if pooling is None:
        return no("pooling other than mean or CLS")
    if cfg.get("model_type") != "bert":
        return no(f"model_type {cfg.get('model_type')!r}")
    if cfg.get("hidden_act") not in ACTIVATIONS:
        return no(f"activation {cfg.get('hidden_act')!r}")
    if cfg.get("position_embedding_type", "absolute") != "absolute" or cfg.get("is_decoder") \
            or cfg.get("add_cross_attention"):
        return no("relative positions or a decoder")
    if not (folder / "model.safetensors").is_file():
        return no("no model.safetensors")
    if not (model_path / "tokenizer.json").is_file() and not any(model_path.glob("*/tokenizer.json")):
        return no("no tokenizer.json")
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        spec = BertSpec(folder, int(cfg["num_hidden_layers"]), hidden, heads, float(cfg["layer_norm_eps"]),
                        cfg["hidden_act"], int(cfg["max_position_embeddings"]), pooling,
                        int(cfg["intermediate_size"]))
    except (KeyError, TypeError, ValueError) as e:
        return no(f"config.json: {e}")
    if hidden % heads:
        return no("hidden size not a multiple of the heads")
    return spec


def load_weights(spec: BertSpec) -> dict[str, np.ndarray] | None:
    """The encoder's weights as float32 arrays named as in ``BertModel`` (a task head's ``bert.`` prefix
    dropped), or None where they cannot be read so (bf16 tensors: numpy has no bf16; a missing tensor)."""
    from safetensors import safe_open

    out = {}
    try:
        with safe_open(str(spec.folder / "model.safetensors"), framework="numpy") as f:
            for name in f.keys():
                key = name.removeprefix("bert.")
                if key.startswith(("embeddings.", "encoder.")):
                    out[key] = np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)
    except (OSError, ValueError, TypeError) as e:  # e.g. bf16: "data type 'bfloat16' not understood"
        logger.debug("%s: weights not readable by numpy (%s): graph exported from torch", spec.folder, e)
        return None
    missing = [k for k in _names(spec) if k not in out]
    if missing:
        logger.debug("%s: weights missing %s: graph exported from torch", spec.folder, missing[:3])
        return None
    return out


def _names(spec: BertSpec) -> list[str]:
    names = [f"embeddings.{n}" for n in ("word_embeddings.weight", "position_embeddings.weight",
                                          "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")]
    for i in range(spec.layers):
        p = f"encoder.layer.{i}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                  "intermediate.dense", "output.dense"):
            names += [p + m + ".weight", p + m + ".bias"]
        for m in ("attention.output.LayerNorm", "output.LayerNorm"):
            names += [p + m + ".weight", p + m + ".bias"]
    return names


# -- the OpenVINO graph --------------------------------------------------------------------------------------------
def build_graph(spec: BertSpec, w: dict[str, np.ndarray]):
    """The ``openvino.Model``: ``input_ids`` and ``attention_mask`` (B, L) int64 -> ``sentence_embedding`` (B, D)
    float32, L2-normalised: what ``export.export_embedding`` traces from torch, written with OpenVINO operations."""
    from retr.retrieval.backends.quiet import vendor_telemetry_off

    vendor_telemetry_off()
    import openvino as ov
    import openvino.opset13 as op

    def const(a):
        return op.constant(np.ascontiguousarray(a, dtype=np.float32))

    def i64(v):
        return op.constant(np.array(v, dtype=np.int64))

    def linear(x, name):  # x @ W.T + b, W (out, in) as torch keeps it
        return op.add(op.matmul(x, const(w[name + ".weight"]), False, True), const(w[name + ".bias"]))

    def layer_norm(x, name):
        n = op.mvn(x, i64([-1]), True, spec.eps, "inside_sqrt")
        return op.add(op.multiply(n, const(w[name + ".weight"])), const(w[name + ".bias"]))

    dh = spec.hidden // spec.heads
    ids = op.parameter([-1, -1], ov.Type.i64, name="input_ids")
    mask = op.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    length = op.gather(op.shape_of(ids), i64(1), i64(0))
    pos = op.gather(const(w["embeddings.position_embeddings.weight"]), op.range(i64(0), length, i64(1), "i64"),
                    i64(0))  # (L, H)
    x = op.add(op.add(op.gather(const(w["embeddings.word_embeddings.weight"]), ids, i64(0)), pos),
               const(w["embeddings.token_type_embeddings.weight"][0]))  # (B, L, H): every token of type 0
    x = layer_norm(x, "embeddings.LayerNorm")
    maskf = op.convert(mask, ov.Type.f32)  # (B, L)
    bias = op.unsqueeze(op.multiply(op.subtract(op.constant(np.float32(1.0)), maskf),
                                    op.constant(np.finfo(np.float32).min)), i64([1, 2]))  # (B, 1, 1, L)
    split = i64([0, 0, spec.heads, dh])
    scale = op.constant(np.float32(1.0 / np.sqrt(dh)))
    for i in range(spec.layers):
        p = f"encoder.layer.{i}."

        def heads(name, x=x, p=p):  # (B, L, H) -> (B, heads, L, dh)
            return op.transpose(op.reshape(linear(x, p + name), split, True), i64([0, 2, 1, 3]))

        # attention as transformers' eager attention computes it, which OpenVINO fuses (its ScaledDotProductAttention
        # operation measured slower: 32 x 256 tokens in bf16, one thread, alternating: 492.6 against 474.5 ms at best)
        scores = op.add(op.multiply(op.matmul(heads("attention.self.query"), heads("attention.self.key"), False, True),
                                    scale), bias)  # (B, heads, L, L)
        a = op.matmul(op.softmax(scores, -1), heads("attention.self.value"), False, False)  # (B, heads, L, dh)
        a = op.reshape(op.transpose(a, i64([0, 2, 1, 3])), i64([0, 0, spec.hidden]), True)  # (B, L, H)
        x = layer_norm(op.add(linear(a, p + "attention.output.dense"), x), p + "attention.output.LayerNorm")
        f = op.gelu(linear(x, p + "intermediate.dense"), ACTIVATIONS[spec.activation])  # (B, L, I)
        x = layer_norm(op.add(linear(f, p + "output.dense"), x), p + "output.LayerNorm")
    if spec.pooling == "cls":
        e = op.squeeze(op.gather(x, i64([0]), i64(1)), i64([1]))
    else:
        m = op.unsqueeze(maskf, i64(-1))  # (B, L, 1)
        e = op.divide(op.reduce_sum(op.multiply(x, m), i64(1), False),
                      op.maximum(op.reduce_sum(m, i64(1), False), op.constant(np.float32(1e-9))))
    e = op.normalize_l2(e, i64([1]), 1e-12, "max")  # torch.nn.functional.normalize's eps, as the export has it
    model = ov.Model([e], [ids, mask], "sentence_embedding")
    model.outputs[0].get_tensor().set_names({"sentence_embedding"})
    return model


# -- the numpy forward pass ----------------------------------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1.5e-7 (Abramowitz & Stegun 7.1.26): numpy has none, and scipy is not needed for one check."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t \
        * np.exp(-a * a)
    return s * y


def _gelu(x: np.ndarray, mode: str) -> np.ndarray:
    if mode == "erf":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


class Feeder:
    """Texts tokenised as the encoder tokenises them (``batching.fast_tokenizer``), truncated to a max length and
    padded: (B, L) int64 input ids and mask. A reference's ``feed``, kept apart from any weights."""

    def __init__(self, tokenizer_dir: Path):
        self._dir = tokenizer_dir
        self._ids: dict[int, batching.FastIds] = {}  # the model's truncating tokenizer, per max length asked for

    def ids(self, texts: list[str], max_length: int) -> list[np.ndarray]:
        """The token ids of ``texts``, truncated, unpadded."""
        if max_length not in self._ids:
            self._ids[max_length] = batching.fast_tokenizer(self._dir, max_length)
        return self._ids[max_length](texts)

    def __call__(self, texts: list[str], max_length: int) -> dict[str, np.ndarray]:
        rows = self.ids(texts, max_length)
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        width = int(lengths.max())
        return {"input_ids": batching.padded(rows, np.arange(len(rows)), width, lengths),
                "attention_mask": batching.attention_mask(lengths, width)}


def _one_at_a_time(reference, texts: list[str], max_length: int, dim: int) -> np.ndarray:
    """A reference's normalised embeddings of ``texts``, one text at a time (no padding in the reference): its
    ``feed`` then its ``forward``, each text read from its ``known`` (vectors by ``batching.row_key`` of the token
    ids) where it ran before, and kept there."""
    out = []
    for t in texts:
        feed = reference.feed([t], max_length)
        key = batching.row_key(feed["input_ids"][0])
        if key not in reference.known:
            reference.known[key] = reference.forward(**feed)[0]
        out.append(reference.known[key])
    return np.stack(out).astype(np.float32, copy=False) if out else np.zeros((0, dim), dtype=np.float32)


class NumpyBert:
    """The same bi-encoder as a plain numpy forward pass in float32 (BERT as transformers computes it, then the
    pooling and normalisation), with the model's own tokenizer: what a built graph is checked against, in place of
    torch. Its two methods are what ``export.verify_embedding`` and ``export.rank_noise`` ask of a reference."""

    def __init__(self, spec: BertSpec, weights: dict[str, np.ndarray], tokenizer_dir: Path):
        self.spec, self.w = spec, weights
        self.feed = Feeder(tokenizer_dir)
        # its vectors of texts it ran (``_one_at_a_time``); a graph checked against it keeps them
        # (``Graph.reference_known``), and a graph built again from the same weights to be quantised reads them
        self.known: dict = {}

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, L) ids and mask (a ``feed``) -> (B, D) float32, L2-normalised."""
        ids, mask = input_ids, attention_mask
        s, w = self.spec, self.w
        b_, length = ids.shape
        dh = s.hidden // s.heads
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length] \
            + w["embeddings.token_type_embeddings.weight"][0]  # (B, L, H)
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], s.eps)
        bias = ((1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min).astype(np.float32)  # (B, 1, 1, L)

        def lin(v, name):
            return v @ w[name + ".weight"].T + w[name + ".bias"]

        for i in range(s.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (lin(x, p + f"attention.self.{n}").reshape(b_, length, s.heads, dh).transpose(0, 2, 1, 3)
                       for n in ("query", "key", "value"))  # (B, heads, L, dh)
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh) + bias  # (B, heads, L, L)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            a = (scores / scores.sum(-1, keepdims=True)) @ v
            a = a.transpose(0, 2, 1, 3).reshape(b_, length, s.hidden)
            x = _layer_norm(lin(a, p + "attention.output.dense") + x, w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"], s.eps)
            f = lin(_gelu(lin(x, p + "intermediate.dense"), ACTIVATIONS[s.activation]), p + "output.dense")
            x = _layer_norm(f + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], s.eps)
        if s.pooling == "cls":
            e = x[:, 0]
        else:
            m = mask[:, :, None].astype(np.float32)
            e = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return e.astype(np.float32)

    def embed(self, texts: list[str], max_length: int) -> np.ndarray:
        return _one_at_a_time(self, texts, max_length, self.spec.hidden)


class CompiledReference:
    """The built graph compiled in fp32, as a reference with ``NumpyBert``'s two methods: what a static int8 graph
    quantised from the built graph is checked against (its ranking-noise check embeds ~110 texts: ~1 s here against
    ~19 s for the numpy pass on 2 cores). Used only once it agrees with the numpy pass on ``export.CHECK_TEXTS``
    (``Built.quick_reference``)."""

    def __init__(self, model, numpy_reference: NumpyBert, known: dict | None = None):
        from retr.retrieval.backends.quiet import vendor_telemetry_off

        vendor_telemetry_off()
        import openvino as ov

        self._compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        self._request = self._compiled.create_infer_request()
        self.feed = numpy_reference.feed  # the tokenizer alone: the numpy weights are not held
        self.dim = numpy_reference.spec.hidden
        # the same graph's fp32 vectors of texts it ran, one at a time, by their token ids (``batching.row_key``):
        # those a static int8 graph's statistics pass computed (retr's sample: its ranking-noise check's texts),
        # and those embedded here; read instead of running a text again
        self.known = known if known is not None else {}

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        self._request.infer({"input_ids": input_ids, "attention_mask": attention_mask})
        return self._request.get_output_tensor(0).data.copy()

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:  # a runner, for export.verify_embedding
        return self.forward(**feeds)

    def embed(self, texts: list[str], max_length: int) -> np.ndarray:
        return _one_at_a_time(self, texts, max_length, self.dim)


# the least cosine of the fp32-compiled built graph to the numpy pass for it to stand in as the reference
QUICK_REFERENCE_FLOOR = 0.9999


def embed_in_batches(runner, feed, texts: list[str], max_length: int, batch: int = 16,
                     streams: bool = True) -> np.ndarray:
    """``runner``'s vectors of ``texts`` (``feed``: a reference's tokenizer), in length-sorted batches of ``batch``
    texts: as many at once as the runner has streams (``run_batches``), or with ``streams=False`` one call each
    (a one-stream runner whose batch requests would be held beside its single-call one)."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    chunks = [order[s:s + batch] for s in range(0, len(order), batch)]
    items = ((k, feed([texts[i] for i in idx], max_length)) for k, idx in enumerate(chunks))
    rows: list = [None] * len(texts)
    for k, result in runner.run_batches(items) if streams else ((k, runner(f)) for k, f in items):
        for i, row in zip(chunks[k], result, strict=True):
            rows[i] = row
    return np.stack(rows).astype(np.float32, copy=False)


class GraphReference:
    """A verified fp32 graph of the model, compiled already (the base graph an encoding holds), as the reference an
    int8 graph made from it (static or int8 weights) is checked against: ``NumpyBert``'s two methods, its texts
    through the graph's own streams in length-sorted batches. Nothing is built, compiled or held for the checks
    (``Built.quick_reference`` builds the graph again, compiles it a second time and checks it against the numpy
    pass first: ~1.2 s, then ~2 s embedding one text at a time, for MiniLM on 2 cores)."""

    def __init__(self, runner, tokenizer_dir: Path, dim: int, known: dict | None = None):
        self.runner = runner
        self.feed = Feeder(tokenizer_dir)
        self.dim = dim
        self.known = known if known is not None else {}  # the graph's vectors of texts it ran (``Graph.known``)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.runner({"input_ids": input_ids, "attention_mask": attention_mask})

    def remember(self, texts: list[str], max_length: int) -> None:
        """Keep the graph's vectors of ``texts`` (``known``), computed now where they are not kept yet: then its
        compiled streams can go, and ``embed`` still answers for them."""
        keys = [batching.row_key(r) for r in self.feed.ids(texts, max_length)]
        missing = [(t, k) for t, k in zip(texts, keys, strict=True) if k not in self.known]
        if missing:
            vectors = embed_in_batches(self.runner, self.feed, [t for t, _ in missing], max_length)
            self.known.update(zip((k for _, k in missing), vectors, strict=True))

    def embed(self, texts: list[str], max_length: int) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        known = [self.known.get(batching.row_key(r)) for r in self.feed.ids(texts, max_length)]
        if all(v is not None for v in known):
            return np.stack(known).astype(np.float32, copy=False)
        return embed_in_batches(self.runner, self.feed, texts, max_length)


@dataclass(frozen=True)
class Built:
    """A graph built from a model's weights and the reference it is checked against."""
    model: object  # openvino.Model
    reference: NumpyBert

    def quick_reference(self, max_length: int, verify, known: dict | None = None) -> tuple[object, str]:
        """A faster reference for the checks of a graph quantised from this one: the built graph compiled in fp32
        where it agrees with the numpy pass (``verify``: ``export.verify_embedding``, cosine >=
        ``QUICK_REFERENCE_FLOOR``), else the numpy pass; and what it is, for the graph's manifest. ``known``: this
        graph's fp32 vectors of texts already run (``CompiledReference.known``)."""
        compiled = CompiledReference(self.model, self.reference, known)
        agreement = verify(compiled, self.reference, max_length)
        if agreement >= QUICK_REFERENCE_FLOOR:
            return compiled, (f"its graph built from the weights in fp32 (cosine {agreement:.6f} to a numpy forward "
                              "pass of its weights)")
        return self.reference, "a numpy forward pass of its weights"


def build_embedding(model_path: Path) -> Built | None:
    """The built graph and its numpy reference for the bi-encoder at ``model_path``, or None where this module
    does not know the model (its graph then comes from torch)."""
    spec = bert_spec(model_path)
    weights = load_weights(spec) if spec is not None else None
    if weights is None:
        return None
    return Built(build_graph(spec, weights), NumpyBert(spec, weights, model_path))
