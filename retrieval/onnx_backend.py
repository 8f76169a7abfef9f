"""ONNX Runtime / OpenVINO inference for the bi-encoder: exported once per model, verified, cached.

The export wraps the transformer with the model's own pooling (mean or CLS) and L2
normalisation, with dynamic batch and sequence axes (``torch.onnx.export(dynamo=True)``), so
one graph serves any padded batch. Before an exported (or quantised) graph is trusted it is
compared with the torch model on padded batches of mixed lengths; a graph whose embeddings do
not match (cosine below the variant's floor) is refused, never cached.

Variants: ``onnx`` (ONNX Runtime fp32), ``onnx-int8`` (ONNX Runtime, dynamic int8 MatMuls) and
``openvino`` (the same fp32 graph converted to OpenVINO IR, run in bf16 where the CPU has native
bf16 instructions, fp32 elsewhere; the precision used is recorded in the cache manifest) and
``openvino-int8`` (that IR with static int8 MatMuls, NNCF post-training quantisation calibrated on a
sample of the corpus being encoded; cached per model and calibration sample; the rest of the graph
runs as ``openvino`` does).
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

# variant -> min cosine to torch (check batch)
VARIANTS = {"onnx": 0.9999, "onnx-int8": 0.985, "openvino": 0.999, "openvino-int8": 0.98}
MODEL_FILE = {"onnx": "model.onnx", "onnx-int8": "model.onnx", "openvino": "model.xml", "openvino-int8": "model.xml"}
CALIBRATED = {"openvino-int8": "openvino"}  # variant calibrated on a corpus -> the graph for any other text
TOKENIZE_CHUNK = 512  # texts per tokenizer call
CALIBRATION_TEXTS = 128  # texts sampled from the corpus (measured on SciFact: 128 vs 300 texts, same nDCG@10)
# cross-encoders: minimum agreement with torch, 1 - max |score difference| / max(1, score range)
CE_VARIANTS = {"onnx": 0.999, "onnx-int8": 0.95, "openvino": 0.98}
CHECK_TEXTS = [
    "a",
    "What causes the northern lights?",
    "Mitochondria are membrane-bound organelles that generate most of the chemical energy needed to power the "
    "cell's biochemical reactions. Chemical energy produced by the mitochondria is stored in ATP.",
    "BM25 ranks documents by term frequency, inverse document frequency and length normalisation; dense "
    "retrieval embeds queries and documents into one vector space. " * 6,
    "short query",
    "Zero-shot evaluation on heterogeneous benchmarks.",
]


def _pooling_mode(st_model) -> str:
    pools = [m for m in st_model if type(m).__name__ == "Pooling"]
    if len(pools) != 1:
        raise RetrError("ONNX export supports models with one Pooling module")
    cfg = pools[0].get_config_dict()
    mode = cfg.get("pooling_mode")
    if mode is None:  # sentence-transformers < 6 keeps one flag per mode
        mode = "cls" if cfg.get("pooling_mode_cls_token") else "mean" if cfg.get("pooling_mode_mean_tokens") else None
    if mode not in ("mean", "cls"):
        raise RetrError(f"ONNX export supports mean or CLS pooling, not {mode!r}")
    return mode


def _check_layout(st_model) -> None:
    names = [type(m).__name__ for m in st_model]
    if names[:2] != ["Transformer", "Pooling"] or any(n not in ("Transformer", "Pooling", "Normalize") for n in names):
        raise RetrError(f"ONNX export supports Transformer + Pooling (+ Normalize) models, not {names}")


def export_onnx(st_model, path: Path) -> None:
    """Export transformer + pooling + normalisation to ``path`` with dynamic batch/sequence axes."""
    import torch

    _check_layout(st_model)
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
    _torch_export(Embed(hf).eval(), ex, ["input_ids", "attention_mask"], "sentence_embedding", path)


def export_cross_encoder(ce_model, path: Path) -> None:
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
    _torch_export(Score(hf).eval(), ex, ["input_ids", "attention_mask", "token_type_ids"], "score", path)


def _torch_export(module, example, input_names: list[str], output_name: str, path: Path) -> None:
    """torch.onnx (dynamo) export with dynamic batch and sequence axes on every input."""
    import torch

    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=4096)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, tuple(example[n] for n in input_names), str(path), dynamo=True,
                              input_names=input_names, output_names=[output_name],
                              dynamic_shapes={n: {0: batch, 1: seq} for n in input_names}, verbose=False)
    finally:
        exporter_log.setLevel(level)


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 (per-channel weights, MatMul only: embeddings and norms stay fp32)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), per_channel=True, op_types_to_quantize=["MatMul"],
                     weight_type=QuantType.QInt8)


@dataclass(frozen=True)
class Calibration:
    """Texts (token ids) a static int8 graph is calibrated on; ``digest`` names the cached graph."""
    rows: tuple[tuple[int, ...], ...]
    digest: str

    @classmethod
    def sample(cls, token_rows: list[list[int]], n: int = CALIBRATION_TEXTS, seed: int = 0) -> Calibration:
        """``n`` rows drawn with a fixed seed: the same corpus always gives the same calibration."""
        import hashlib

        idx = np.sort(np.random.default_rng(seed).choice(len(token_rows), min(n, len(token_rows)), replace=False))
        rows = tuple(tuple(int(t) for t in token_rows[i]) for i in idx)
        h = hashlib.sha256()
        for r in rows:
            h.update(np.asarray(r, dtype=np.int64).tobytes() + b"|")
        return cls(rows, h.hexdigest())

    def feeds(self):
        for r in self.rows:  # one text per feed: no padding in the statistics
            ids = np.asarray([r], dtype=np.int64)
            yield {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def base_variant(variant: str) -> str:
    """The graph a variant runs on when there is no corpus to calibrate on (itself, unless calibrated)."""
    return CALIBRATED.get(variant, variant)


def quantize_static_int8(src: Path, dst: Path, calibration: Calibration) -> None:
    """Static int8 MatMuls (NNCF, transformer preset with SmoothQuant) of an ONNX graph, saved as OpenVINO IR."""
    try:
        import nncf
    except ImportError:
        raise RetrError("static int8 needs nncf (pip install nncf)") from None
    import openvino as ov

    model = ov.Core().read_model(str(src))
    feeds = list(calibration.feeds())
    quantized = nncf.quantize(model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                              preset=nncf.QuantizationPreset.MIXED, subset_size=len(feeds))
    ov.save_model(quantized, str(dst), compress_to_fp16=False)


@dataclass
class OnnxSession:
    session: object  # a runner: feeds {name: int64 array} -> first output
    path: Path
    variant: str
    check_cosine: float
    dim: int
    precision: str = "fp32"


def openvino_precision() -> str:
    """bf16 where OpenVINO reports native bf16 on this CPU (AVX-512 BF16 / AMX), else fp32."""
    import openvino as ov

    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return "bf16" if "BF16" in caps else "fp32"


class OrtRunner:
    """An ONNX Runtime session with retr's thread policy."""

    def __init__(self, path: Path, threads: int, precision: str = "fp32"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.precision = precision

    parallel = 1  # batches in flight in run_batches

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(None, feeds)[0]

    def run_batches(self, items, on_done=None) -> list:
        """``[(key, output)]`` for an iterable of ``(key, feeds)``, one batch after the other."""
        done = []
        for key, feeds in items:
            done.append((key, self(feeds)))
            if on_done is not None:
                on_done(key)
        return done


class OpenVinoRunner:
    """An OpenVINO compiled model (latency hint, bf16 where native) with one reused infer request."""

    def __init__(self, path: Path, threads: int, precision: str | None = None):
        import openvino as ov

        self.precision = precision or openvino_precision()
        core = ov.Core()
        self._model = core.read_model(str(path))  # kept: the folder may be renamed once verified
        self._precision_hint = "bf16" if self.precision == "bf16" else "f32"
        self._request = None  # compiled on first use: a search whose queries take another graph never pays it
        self._threads = threads
        self.parallel = max(1, threads)  # throughput streams, one thread each
        self._queue = None

    @property
    def request(self):
        if self._request is None:
            import openvino as ov

            compiled = ov.Core().compile_model(self._model, "CPU", {
                "INFERENCE_NUM_THREADS": self._threads, "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": self._precision_hint})
            self._request = compiled.create_infer_request()
        return self._request

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        request = self.request
        request.infer(feeds)
        return request.get_output_tensor(0).data.copy()  # the request's buffer is reused by the next call

    def _throughput_queue(self):
        """The same graph compiled for throughput (one stream per thread, each on its own core: no
        synchronisation inside a batch; +20-27% docs/s on 2 cores) with an async request per stream."""
        if self._queue is None:
            import openvino as ov

            core = ov.Core()
            compiled = core.compile_model(self._model, "CPU", {
                "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": self.parallel,
                "INFERENCE_NUM_THREADS": self._threads, "INFERENCE_PRECISION_HINT": self._precision_hint})
            self._queue = ov.AsyncInferQueue(compiled, self.parallel)
        return self._queue

    def run_batches(self, items, on_done=None) -> list:
        """``[(key, output)]`` for an iterable of ``(key, feeds)``, ``parallel`` batches in flight (in completion
        order; ``on_done(key)`` is called from OpenVINO's threads)."""
        queue = self._throughput_queue()
        done = []

        def finished(request, key):
            done.append((key, request.get_output_tensor(0).data.copy()))
            if on_done is not None:
                on_done(key)

        queue.set_callback(finished)
        for key, feeds in items:
            queue.start_async(feeds, key)  # waits for a free request when all are busy
        queue.wait_all()
        return done


def _folder(cache_root: Path, model_hash: str, variant: str, kind: str = "bi",
            calibration: Calibration | None = None) -> Path:
    tag = f"-{calibration.digest[:16]}" if calibration is not None else ""
    return cache_root / "onnx" / f"{model_hash[:24]}-{'ce-' if kind == 'ce' else ''}{variant}{tag}"


def _floor(variant: str, kind: str) -> float:
    return (CE_VARIANTS if kind == "ce" else VARIANTS)[variant]


def find_cached(model_hash: str, variant: str, cache_root: Path, threads: int | None = None,
                kind: str = "bi", calibration: Calibration | None = None) -> OnnxSession | None:
    """The cached, verified export for this model, variant and kind (``bi`` encoder or ``ce``), or None."""
    folder = _folder(cache_root, model_hash, variant, kind, calibration)
    try:
        meta = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("model_hash") != model_hash or meta.get("check_cosine", 0) < _floor(variant, kind) \
            or "dim" not in meta or (calibration is not None and meta.get("calibration") != calibration.digest):
        return None
    precision = _precision(variant)
    if meta.get("precision", precision) != precision:  # verified in another precision: re-verify
        return None
    path = folder / MODEL_FILE[variant]
    runner = _session(path, threads or default_threads(), variant)
    return OnnxSession(runner, path, variant, meta["check_cosine"], int(meta["dim"]), precision)


def _fast_tokenizer_file(model_path: Path | None, max_length: int):
    if model_path is None:
        return None
    candidates = [model_path / "tokenizer.json", *sorted(model_path.glob("*/tokenizer.json"))]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length, strategy="longest_first")
    tok.no_padding()
    return tok


def fast_tokenizer(model_path: Path | None, max_length: int):
    """A ``texts -> token ids`` function from the model's tokenizer.json (no transformers import)."""
    tok = _fast_tokenizer_file(model_path, max_length)
    if tok is None:
        return None

    def token_ids(texts: list[str]) -> list[np.ndarray]:
        # in chunks, kept as arrays: a batch's Encoding objects (offsets, masks, truncated overflow) cost ~60x
        # the ids' memory (measured: +330 MB for SciFact's 5,183 documents encoded in one call)
        out = []
        for i in range(0, len(texts), TOKENIZE_CHUNK):
            out.extend(np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(texts[i: i + TOKENIZE_CHUNK]))
        return out

    return token_ids


def fast_pair_tokenizer(model_path: Path | None, max_length: int):
    """A ``(query, texts) -> (token ids, token type ids)`` function for cross-encoder pairs, or None."""
    tok = _fast_tokenizer_file(model_path, max_length)
    if tok is None:
        return None

    def pair_ids(query: str, texts: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        encs = tok.encode_batch([(query, t) for t in texts])
        return [e.ids for e in encs], [e.type_ids for e in encs]

    return pair_ids


def length_batches(lengths: np.ndarray, token_budget: int):
    """Yield ``(indices, width, attention mask)``: longest first, as many texts per batch as fit ``token_budget``
    padded tokens, each batch padded only to its own longest text."""
    order = np.argsort(-lengths, kind="stable")
    budget = max(token_budget, int(lengths.max()) if len(lengths) else 1)
    start = 0
    while start < len(order):
        width = int(lengths[order[start]])  # longest in this batch (sorted descending)
        size = max(1, min(budget // max(width, 1), len(order) - start))
        idx = order[start:start + size]
        yield idx, width, (np.arange(width)[None, :] < lengths[idx][:, None]).astype(np.int64)
        start += size


def padded(rows: list[list[int]], idx: np.ndarray, width: int, lengths: np.ndarray, fill: int = 0) -> np.ndarray:
    """The rows ``idx`` of ``rows`` as one (len(idx), width) int64 array, right-padded with ``fill``."""
    out = np.full((len(idx), width), fill, dtype=np.int64)
    for r, i in enumerate(idx):
        out[r, : int(lengths[i])] = rows[i]
    return out


def _precision(variant: str) -> str:
    """The arithmetic a variant runs in on this machine."""
    if variant == "openvino-int8":
        return f"int8+{openvino_precision()}"
    return openvino_precision() if variant == "openvino" else "int8" if variant == "onnx-int8" else "fp32"


def _session(path: Path, threads: int, variant: str = "onnx"):
    if base_variant(variant) == "openvino":
        return OpenVinoRunner(path, threads, _precision("openvino"))
    return OrtRunner(path, threads, _precision(variant))


def run_session(session, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    return session({"input_ids": input_ids, "attention_mask": attention_mask})


def verify_cross_encoder(session, ce_model, max_length: int) -> float:
    """Agreement of exported and torch cross-encoder scores on a padded mixed-length batch and on singles:
    1 - max |difference| / max(1, range of the torch scores)."""
    from retr.retrieval.rerank import ce_logits

    pairs = [(q, d) for q in CHECK_TEXTS[1:3] for d in CHECK_TEXTS]
    ref = ce_logits(ce_model, pairs, batch_size=len(pairs))

    def scores(batch):
        enc = ce_model.tokenizer(batch, padding=True, truncation=True, max_length=max_length, return_tensors="np",
                                 return_token_type_ids=True)
        return session({k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})

    got = np.concatenate([scores(pairs), *[scores([p]) for p in pairs[:3]]]).reshape(-1)
    want = np.concatenate([ref, ref[:3]])
    return float(1.0 - np.abs(got - want).max() / max(1.0, float(np.ptp(ref))))


def verify(session, st_model, max_length: int) -> float:
    """Min cosine between ONNX and torch embeddings on one padded mixed-length batch and on singles."""
    import torch

    tok = st_model.tokenizer
    texts = CHECK_TEXTS
    with torch.inference_mode():
        ref = st_model.encode(texts, convert_to_numpy=True, normalize_embeddings=True, batch_size=len(texts))
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    batched = run_session(session, enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64))
    singles = []
    for t in texts[:3]:
        e = tok([t], truncation=True, max_length=max_length, return_tensors="np")
        singles.append(run_session(session, e["input_ids"].astype(np.int64), e["attention_mask"].astype(np.int64))[0])
    cos_b = (batched * ref).sum(1)
    cos_s = (np.stack(singles) * ref[:3]).sum(1)
    return float(min(cos_b.min(), cos_s.min()))


def load_or_export(st_model, model_hash: str, variant: str, max_length: int, cache_root: Path,
                   threads: int | None = None, kind: str = "bi", calibration: Calibration | None = None) -> OnnxSession:
    """The verified graph for this model and variant, from the cache or exported now. ``kind``: ``bi``
    (a SentenceTransformer: ids, mask -> normalised embedding) or ``ce`` (a CrossEncoder: ids, mask,
    token types -> one score per pair). ``calibration``: the texts of a calibrated variant (openvino-int8)."""
    from retr.indexes.atomic import atomic_dir
    from retr.indexes.manifest import new_manifest

    if variant not in VARIANTS:
        raise RetrError(f"unknown ONNX variant {variant!r}")
    if (variant in CALIBRATED) != (calibration is not None):
        raise RetrError(f"{variant}: a calibration sample is {'needed' if variant in CALIBRATED else 'not used'}")
    threads = threads or default_threads()
    cached = find_cached(model_hash, variant, cache_root, threads, kind, calibration)
    if cached is not None:
        return cached
    folder = _folder(cache_root, model_hash, variant, kind, calibration)
    path = folder / MODEL_FILE[variant]
    logger.info("exporting %s to ONNX (%s), once per model", model_hash[:12], variant)
    t0 = time.perf_counter()
    with atomic_dir(folder) as tmp:
        fp32 = tmp / "model.fp32.onnx"
        (export_cross_encoder if kind == "ce" else export_onnx)(st_model, fp32)
        final = tmp / MODEL_FILE[variant]
        if variant == "onnx-int8":
            quantize_int8(fp32, final)
        elif variant == "openvino-int8":
            logger.info("calibrating static int8 on %d texts of the corpus (once per model and corpus)",
                        len(calibration.rows))
            quantize_static_int8(fp32, final, calibration)
        elif variant == "openvino":
            import openvino as ov

            ov.save_model(ov.Core().read_model(str(fp32)), str(final), compress_to_fp16=False)
        else:
            os.replace(fp32, final)  # its external data file keeps the name the graph refers to
        if variant != "onnx":
            for extra in tmp.glob("model.fp32.onnx*"):  # the fp32 graph and its external data, once converted
                extra.unlink()
        session = _session(final, threads, variant)
        if kind == "ce":
            cos, dim = verify_cross_encoder(session, st_model, max_length), 1
        else:
            cos = verify(session, st_model, max_length)
            dim = int(run_session(session, np.array([[1, 2]], dtype=np.int64),
                                  np.ones((1, 2), dtype=np.int64)).shape[1])
        if cos < _floor(variant, kind):
            what = "agreement" if kind == "ce" else "cosine"
            raise RetrError(f"the {variant} export of model {model_hash[:12]} disagrees with torch ({what} {cos:.4f} "
                            f"< {_floor(variant, kind)}): use --backend torch")
        manifest = new_manifest("retr-onnx", variant=variant, graph=kind, model_hash=model_hash, check_cosine=cos, dim=dim,
                                precision=_precision(variant), max_length=max_length,
                                export_seconds=time.perf_counter() - t0,
                                **({"calibration": calibration.digest, "calibration_texts": len(calibration.rows)}
                                   if calibration is not None else {}))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    logger.info("%s (%s) verified against torch: min cosine %.6f", variant, _precision(variant), cos)
    # the verified session is the one returned (its weights are in memory / mapped from files renamed, not removed)
    return OnnxSession(session, path, variant, cos, dim, _precision(variant))


def open_graph(get_model, model_hash: str, variant: str, max_length: int, cache_root: Path, kind: str = "bi",
               use_cache_alone: bool = True, calibration: Calibration | None = None) -> OnnxSession | None:
    """The verified graph of a model (bi-encoder or cross-encoder) for ``variant``: from the cache, or exported
    from ``get_model()`` now; openvino falls back to onnx where it is not installed. None (with a warning) when
    the export itself fails: the caller then runs torch. ``use_cache_alone=False`` when the caller needs the
    torch model anyway (no fast tokenizer), so the cache lookup is left to ``load_or_export``."""
    if base_variant(variant) == "openvino":
        try:
            import openvino  # noqa: F401
        except ImportError:
            logger.warning("openvino is not installed: using the onnx backend")
            variant, calibration = "onnx", None
    sess = find_cached(model_hash, variant, cache_root, kind=kind, calibration=calibration) if use_cache_alone else None
    if sess is None:
        try:
            sess = load_or_export(get_model(), model_hash, variant, max_length, cache_root, kind=kind,
                                  calibration=calibration)
        except RetrError:
            raise
        except Exception as e:  # noqa: BLE001 - an export failure must not stop the user
            what = "cross-encoder" if kind == "ce" else "bi-encoder"
            logger.warning("%s export failed (%s): using the torch backend", what, str(e).splitlines()[0][:200])
            return None
    return sess


def default_threads() -> int:
    """ONNX Runtime intra-op threads: the machine's cores, at most 4 (one policy for export and load)."""
    return max(1, min(os.cpu_count() or 1, 4))
