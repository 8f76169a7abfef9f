"""A verified graph for a model and backend: from the cache (checked) or exported, converted and checked now.

Cache folder: ``$RETR_CACHE/onnx/<model hash>-[ce-]<backend>[-<calibration>]/`` holding the graph file(s) and a
``manifest.json`` written last, with the graph's agreement with torch and the checksum of every file. An entry
whose files do not match their checksums, whose manifest is unreadable or whose graph fails to load is
discarded with a warning and rebuilt. A graph that disagrees with torch, or adds more ranking noise than its
backend allows, is refused: its folder then keeps only a manifest saying why, so that the next run refuses it
without exporting it again (until the bars, the CPU's precision or the library versions change).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from retr.retrieval.artifacts import (
    atomic_dir,
    check_checksums,
    checksums,
    new_manifest,
    read_small,
    versions,
    write_json,
)
from retr.retrieval.backends import batching
from retr.retrieval.backends.direct import QUICK_REFERENCE_FLOOR
from retr.retrieval.backends.export import EMBEDDING, Calibration, GraphKind, read_graph
from retr.retrieval.backends.quiet import vendor_telemetry_off
from retr.retrieval.backends.registry import BACKENDS, Backend, get_backend
from retr.retrieval.backends.runners import RUNTIMES, default_threads
from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

GRAPH_KIND = "retr-onnx"
# how graphs are exported (export.torch_export); a cached graph of another generation is exported again, so that
# a machine's int8 graphs and the scores they give do not depend on when its cache was filled. 2: TorchScript's
# exporter first, dynamo where it fails (1: dynamo alone); 3: with eager attention (export.eager_attention); 4: a
# BERT bi-encoder's OpenVINO graphs built from its weights (``direct``), not exported from torch
EXPORT_GENERATION = 4


@dataclass(frozen=True)
class GraphId:
    """What makes a graph's numbers what they are, as one value: the model, the backend, how it was exported, the
    precision it computes in on this CPU and, for a calibrated graph, what it was calibrated on. ``key`` names it
    in the embedding and index cache keys and in the chooser's stored choices."""
    model_hash: str
    backend: str
    generation: int | None = EXPORT_GENERATION  # None: torch, nothing exported
    precision: str = "fp32"
    calibration: str | None = None  # the calibration sample's digest

    @property
    def key(self) -> str:
        """``backend[@calibration]/export<generation>/<precision>`` (``torch`` alone): the model is keyed apart."""
        if self.generation is None:
            return self.backend
        tag = f"@{self.calibration[:16]}" if self.calibration else ""
        return f"{self.backend}{tag}/export{self.generation}/{self.precision}"


@dataclass(frozen=True)
class Graph:
    """A loaded, verified graph: what runs a batch, and what it is."""
    runner: object  # feeds {name: int64 array} -> first output; run_batches for many
    path: Path
    backend: Backend
    check: float  # agreement with torch (the backend's measure for this kind)
    dim: int
    precision: str
    calibration: str | None = None  # digest of the texts a calibrated graph was calibrated on
    rank_noise: float | None = None  # ranking noise it adds on retr's sample, where its backend checks it
    # its vectors of texts it has run, each by ``batching.row_key`` of its token ids: retr's sample passages, which
    # the planner times it on, or retr's calibration sample, which a static int8 graph's statistics pass runs it
    # over, are then what the checks of an int8 graph made from it read as their reference instead of running
    # them through it again (~0.9 s of a first run, MiniLM on 2 cores)
    known: dict = field(default_factory=dict, compare=False, repr=False)
    # the vectors of the reference it was checked against, by the same keys, where it was built from the weights
    # (the numpy pass's of ``CHECK_TEXTS``): a graph built again from those weights to be quantised reads them for
    # its reference's own check instead of running the numpy pass again (~0.8 s of a first run, MiniLM, 2 cores of
    # an AVX-512 BF16 EPYC)
    reference_known: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def variant(self) -> str:
        return self.backend.name

    def identity(self, model_hash: str) -> GraphId:
        return GraphId(model_hash, self.backend.name, EXPORT_GENERATION, self.precision, self.calibration)

    def info(self) -> dict:
        info = {"backend": self.backend.name, "precision": self.precision, "check_cosine": self.check}
        if self.calibration is not None:
            info["calibration"] = self.calibration
        if self.rank_noise is not None:
            info["rank_noise"] = self.rank_noise
        return info


def lone_feed(graph: Graph, row, max_length: int | None = None) -> dict:
    """One text's feed through ``graph`` (a query alone): padded to its runner's ``lone_multiple`` tokens where
    padding cannot change the text's vector (``Backend.batch_invariant``: not dynamic int8, whose activation scales
    would take in the padding), else at its own length (``batching.lone_feed``)."""
    return batching.lone_feed(row, lone_multiple(graph), max_length)


def lone_multiple(graph: Graph) -> int:
    """The multiple of tokens a text alone is padded to through ``graph`` (``lone_feed``; 1: not padded)."""
    return getattr(graph.runner, "lone_multiple", 1) if graph.backend.batch_invariant else 1


def graph_info(graph: Graph | None) -> dict:
    """How texts were encoded: a graph's backend, precision and agreement with torch, or torch itself."""
    return graph.info() if graph is not None else {"backend": "torch", "precision": "fp32", "check_cosine": None}


def cache_folder(cache_root: Path, model_hash: str, backend: Backend, kind: GraphKind,
                 calibration: Calibration | None = None) -> Path:
    tag = f"-{calibration.digest[:16]}" if calibration is not None else ""
    return cache_root / "onnx" / f"{model_hash[:24]}-{kind.folder_tag}{backend.name}{tag}"


def _runner(backend: Backend, path: Path, threads: int):
    return RUNTIMES[backend.runtime](path, threads, backend.precision())


_verified: dict[tuple, bool] = {}  # (folder, sizes and mtimes) -> checksums matched, once per process


def _files_ok(folder: Path, files: dict) -> str | None:
    try:
        key = (str(folder), tuple((r, (folder / r).stat().st_size, (folder / r).stat().st_mtime_ns) for r in files))
    except OSError as e:
        return f"{e.filename}: missing"
    if _verified.get(key):
        return None
    bad = check_checksums(folder, files)
    if bad is None:
        _verified[key] = True
    return bad


def _discard(folder: Path, why: str) -> None:
    logger.warning("cached graph %s is damaged (%s): discarded (made again where it is next needed)", folder, why)
    shutil.rmtree(folder, ignore_errors=True)


def find_cached(model_hash: str, backend: Backend, kind: GraphKind, cache_root: Path, threads: int | None = None,
                calibration: Calibration | None = None) -> Graph | None:
    """The cached, verified graph for this model, backend and kind, or None (absent, or damaged and discarded)."""
    folder = cache_folder(cache_root, model_hash, backend, kind, calibration)
    if not folder.is_dir():
        return None
    try:
        meta = json.loads(read_small(folder / "manifest.json"))  # a small regular file: never a FIFO or /dev/zero
        if meta.get("refused") is None:  # not a JSON object: AttributeError
            check, dim, files = float(meta["check_cosine"]), int(meta["dim"]), meta["files"]
            if not isinstance(files, dict) or dim < 1:
                raise ValueError(f"files {type(files).__name__}, dim {dim}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RetrError) as e:
        _discard(folder, f"manifest: {e}")
        return None
    if meta.get("refused") is not None:
        _refused_before(folder, meta, model_hash, backend, kind)
        return None
    if meta.get("model_hash") != model_hash or check < backend.floor(kind) or backend.file not in files \
            or (calibration is not None and meta.get("calibration") != calibration.digest) \
            or (backend.noise_bound(kind) is not None and meta.get("rank_noise", 0.0) > backend.noise_bound(kind)):
        _discard(folder, "its manifest names another model, backend or calibration, or a looser check")
        return None
    generation = meta.get("export_generation", 1)
    if generation != EXPORT_GENERATION:  # exported the way an earlier retr did: not damaged
        logger.info("cached graph %s was exported by an earlier procedure (generation %s, now %s): exported again",
                    folder, generation, EXPORT_GENERATION)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    precision = backend.precision()
    if meta.get("precision") != precision:  # verified in another precision (another CPU): verify again
        return None
    bad = _files_ok(folder, files)
    if bad:
        _discard(folder, bad)
        return None
    path = folder / backend.file
    try:
        runner = _runner(backend, path, threads or default_threads())
    except Exception as e:  # noqa: BLE001 - a graph the runtime cannot read is a damaged entry
        _discard(folder, str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        return None
    width = getattr(runner, "output_width", None)  # where the runtime knows it before running (OpenVINO)
    if width is not None and width != dim:
        _discard(folder, f"its graph gives {width}-wide outputs, its manifest says {dim}")
        return None
    if width is None and hasattr(runner, "expect_width"):  # ONNX Runtime: checked when its session is made
        runner.expect_width(dim, lambda why: _discard(folder, why))
    return Graph(runner, path, backend, check, dim, precision, calibration.digest if calibration else None,
                 meta.get("rank_noise"))


_exports: dict[tuple, Path] = {}  # (model hash, graph kind, its exporter) -> this process's fp32 export of it


def _export_fp32(model, model_hash: str, kind: GraphKind, dst: Path) -> None:
    """The model's fp32 ONNX graph at ``dst``: exported once per process and copied for every other backend (a
    first run converts one export into the base and the int8 graphs, and any other backend asked for, instead of
    exporting once each; a torch export is the slow part)."""
    key = (model_hash, kind.name, kind.export)
    src = _exports.get(key)
    if src is None or not src.is_file():
        keep = Path(tempfile.mkdtemp(prefix="retr-export-"))
        atexit.register(shutil.rmtree, keep, True)
        src = keep / dst.name
        kind.export(model, src)
        _exports[key] = src
    for f in src.parent.glob(f"{src.name}*"):  # the graph and its external data file, under the same names
        shutil.copyfile(f, dst.parent / f.name)


def release_others(candidates: dict[str, Graph], chosen: Graph, *keep: Graph | None) -> None:
    """Drop what each candidate graph other than ``chosen`` (and ``keep``) holds, its compiled model or session:
    made again on next use. Once a choice is made, the graphs timed for it and not taken hold nothing."""
    held = {id(g.runner) for g in (chosen, *keep) if g is not None}
    dropped = False
    for graph in candidates.values():
        release = getattr(graph.runner, "release", None)
        if id(graph.runner) not in held and release is not None:
            dropped = release() or dropped
    if dropped:
        release_memory()


def release_memory() -> None:
    """Collect what an export left behind and hand the freed heap back to the system (glibc keeps it otherwise:
    measured on a first `retr eval` of SciFact, the export's and NNCF's ~0.9 GB stayed resident through the
    encoding that followed)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _limits(backend: Backend, kind: GraphKind) -> dict:
    """The bars a graph of this backend and kind was judged by: a refusal stands while they stay the same."""
    return {"floor": backend.floor(kind), "max_rank_noise": backend.noise_bound(kind)}


def _refused_before(folder: Path, meta: dict, model_hash: str, backend: Backend, kind: GraphKind) -> None:
    """A remembered refusal of this model's graph raises it again (no second export and calibration to learn
    it); one judged by other bars, on another CPU precision or by other library versions is discarded and judged
    again."""
    if meta.get("model_hash") == model_hash and meta.get("precision") == backend.precision() \
            and meta.get("limits") == _limits(backend, kind) and meta.get("versions") == versions() \
            and meta.get("export_generation", 1) == EXPORT_GENERATION:
        raise RetrError(str(meta["refused"]))
    shutil.rmtree(folder, ignore_errors=True)


def load_or_export(get_model: Callable[[], object], model_hash: str, backend: Backend, kind: GraphKind,
                   max_length: int, cache_root: Path, threads: int | None = None,
                   calibration: Calibration | None = None, model_path: Path | None = None, *,
                   base: Graph | None = None) -> Graph:
    """The verified graph for this model and backend, from the cache, or made now: for the (uncalibrated)
    OpenVINO backend and a model ``kind.build`` knows (a BERT bi-encoder at ``model_path``), built from the weights
    and checked against a numpy forward pass of them; otherwise exported from ``get_model()`` (a
    sentence-transformers model for ``EMBEDDING``, a CrossEncoder for ``SCORING``) and checked against it.
    ``base``: the model's base graph, compiled and verified already; an int8 graph is made from it and checked
    against it where it computes in fp32 (``_base_reference``)."""
    if not backend.exported:
        raise RetrError(f"the {backend.name} backend runs the torch model: there is no graph to export")
    if backend.calibrated != (calibration is not None):
        raise RetrError(f"{backend.name}: a calibration sample is {'needed' if backend.calibrated else 'not used'}")
    threads = threads or default_threads()
    if (cached := find_cached(model_hash, backend, kind, cache_root, threads, calibration)) is not None:
        return cached
    folder = cache_folder(cache_root, model_hash, backend, kind, calibration)
    precision = backend.precision()
    t0 = time.perf_counter()
    built, reference_graph = None, _base_reference(base, backend, kind, model_path)
    built_known: dict = {}  # the built graph's fp32 vectors by token ids, where its statistics pass ran them
    # static int8 graphs too are quantised from the built graph (export.STATIC_INT8_PROCEDURE 2; the base graph's
    # file where it is given: the same graph): MiniLM's checks there, cosine 0.9908 and ranking noise 0.0294, against
    # 0.9912 and 0.0300 quantised from torch's export
    if reference_graph is None and kind.build is not None and model_path is not None \
            and backend.runtime == "openvino":
        try:
            built = kind.build(model_path)
        except Exception as e:  # noqa: BLE001 - what the builder cannot make, torch exports
            logger.warning("building the %s graph from the weights failed (%s): exporting it from torch", kind.label,
                           str(e).splitlines()[0][:200])
    source = "weights" if built is not None or reference_graph is not None else "torch"
    against = "a numpy forward pass of its weights" if built is not None else "torch"
    if reference_graph is not None:
        against = (f"the {reference_graph.variant} graph it is made from, in fp32 ({kind.measure} "
                   f"{reference_graph.check:.6f} to what that graph was checked against)")
    logger.info("%s %s %s to %s, once per model", "exporting" if source == "torch" else "building", kind.label,
                model_hash[:12], backend.name)
    with atomic_dir(folder) as tmp:
        final = tmp / backend.file
        if reference_graph is not None:  # read again: a model of its own (the base graph's file stays as it is)
            graph, reference = read_graph(reference_graph.path), kind.graph_reference(
                reference_graph.runner, model_path, reference_graph.dim, reference_graph.known)
        elif built is None:
            model = get_model()
            graph, reference = tmp / "model.fp32.onnx", kind.reference(model)
            _export_fp32(model, model_hash, kind, graph)
        else:
            graph, reference = built.model, built.reference
            if base is not None:
                reference.known.update(base.reference_known)  # the same weights' numpy pass, run for the base graph
        if calibration is not None:
            logger.info("calibrating static int8 on retr's fixed sample of %d texts (once per model)",
                        len(calibration.rows))
        # the statistics pass of a calibration runs the reference's own graph in fp32 over the calibration sample
        # (retr's passages and questions): its vectors are the checks' reference vectors, kept with the base graph
        # (~1 s of a first run) or, for the graph built from the weights (a base graph in bf16: not itself a
        # reference), with its fp32 compiled reference, read by the ranking-noise check instead of running its ~110
        # texts again one at a time (MiniLM, 2 cores of an AVX-512 BF16 EPYC: ~1.5 s)
        pass_known = reference_graph.known if reference_graph is not None else built_known if built is not None \
            else None
        if reference_graph is not None and backend.calibrated:
            # nor are its compiled streams needed for the checks once it has run their texts (a few ms): dropped
            # before the statistics pass compiles its own observer, compiled again on the graph's next use.
            # `retr index` of 1,000 new documents on an empty cache, AMX refused, alternating: peak 509-521
            # against 586-592 MiB; the README's first command 547 against 625-633 MiB; the same checks
            reference.remember(list(kind.check_texts), max_length)
            release_others({"reference": reference_graph}, None)
        if backend.calibrated and pass_known is not None:
            def seen(feed, vector):
                pass_known[batching.row_key(feed["input_ids"][0])] = vector

            backend.convert(graph, final, calibration, seen=seen)
        else:
            backend.convert(graph, final, calibration)
        if backend.int8:
            release_memory()  # the quantiser's working memory, before the graphs the checks compile
            if built is not None:
                # int8's checks against the fp32 built graph (seconds, not the numpy pass's ~20), compiled only
                # now: not held in memory beside the quantiser's work
                reference, against = built.quick_reference(max_length, kind.verify, built_known)
        # a graph checked against the numpy pass of its weights keeps what that pass computed (a few vectors)
        numpy_checked = built is not None and reference is built.reference
        del graph, built  # a built model's constants: written, not needed in memory
        # checked on the runner its encoding then uses (its streams: no runner compiled apart for the checks). With
        # NNCF's quantisation resident beside them this put a first `retr eval` of SciFact over 1 GB, so a
        # calibrated graph was checked on one stream and opened again; with retr's own (``quantize``), alternating:
        # 87.4, 96.1 s at 664-665 MiB against 91.4, 97.3 s at 672-673 MiB (AMX Xeon with AMX refused)
        runner = _runner(backend, final, threads)
        check = kind.verify(runner, reference, max_length)
        noise = kind.rank_noise(runner, reference, max_length) \
            if backend.noise_bound(kind) is not None and kind.rank_noise is not None and check >= backend.floor(kind) \
            else None
        measured = {"variant": backend.name, "graph": kind.name, "model_hash": model_hash, "precision": precision,
                    "export_generation": EXPORT_GENERATION, "source": source, "checked_against": against,
                    "check_cosine": check, **({"rank_noise": noise} if noise is not None else {})}
        refusal = None
        if check < backend.floor(kind):
            refusal = (f"the {backend.name} {'build' if source == 'weights' else 'export'} of model "
                       f"{model_hash[:12]} disagrees with {against} ({kind.measure} {check:.4f} < "
                       f"{backend.floor(kind)}): use --backend torch")
        elif noise is not None and noise > backend.noise_bound(kind):
            refusal = (f"the {backend.name} graph of model {model_hash[:12]} adds ranking noise {noise:.4f} > "
                       f"{backend.noise_bound(kind)}")
        if refusal is None:
            dim = kind.dim(runner)
            if calibration is not None:
                measured.update(calibration=calibration.digest, calibration_texts=len(calibration.rows))
            write_json(tmp / "manifest.json", new_manifest(
                GRAPH_KIND, **measured, dim=dim, max_length=max_length, export_seconds=time.perf_counter() - t0,
                files=checksums(tmp)))
        else:  # the graph's files go; the folder keeps the refusal, so that it is not exported again to learn it
            shutil.rmtree(tmp)
            tmp.mkdir()
            write_json(tmp / "manifest.json", new_manifest(GRAPH_KIND, **measured, refused=refusal,
                                                           limits=_limits(backend, kind)))
    reference_known = dict(reference.known) if numpy_checked else {}
    del reference
    release_memory()  # the exporter's and the quantiser's working memory, before the graph's real work starts
    if refusal is not None:
        raise RetrError(refusal)
    logger.info("%s (%s) verified against %s: %s %.6f", backend.name, precision, against, kind.measure, check)
    # the verified runner is the one returned (its weights are in memory / mapped from files renamed, not removed);
    # what it reads again after a release (an ONNX Runtime session) is read from where the folder was published
    runner.moved(folder / backend.file)
    return Graph(runner, folder / backend.file, backend, check, dim, precision,
                 calibration.digest if calibration else None, noise, reference_known=reference_known)


def _base_reference(base: Graph | None, backend: Backend, kind: GraphKind, model_path: Path | None) -> Graph | None:
    """``base`` where a graph of ``backend`` is made from it and checked against it: an OpenVINO int8 graph
    (calibrated or not), an OpenVINO base graph computing in fp32 that agreed with its own reference to
    ``direct.QUICK_REFERENCE_FLOOR``, a kind that can check against a graph, and the model's folder (its
    tokenizer). Its compiled streams then embed the checks' texts: nothing is built or compiled again for them."""
    if base is None or not backend.int8 or backend.runtime != "openvino" or kind.graph_reference is None \
            or model_path is None or base.backend.runtime != "openvino" or base.precision != "fp32" \
            or base.check < QUICK_REFERENCE_FLOOR:
        return None
    return base


def open_graph(get_model: Callable[[], object], model_hash: str, backend_name: str, max_length: int,
               cache_root: Path, kind: GraphKind = EMBEDDING, use_cache_alone: bool = True,
               calibration: Calibration | None = None, threads: int | None = None,
               model_path: Path | None = None, base: Graph | None = None) -> Graph | None:
    """The verified graph of a model for ``backend_name``: from the cache, or made now (``load_or_export``: built
    from the weights at ``model_path`` where it can be, else exported from ``get_model()``; ``base``: see there).
    ``threads``: its runner's inference threads (default: ``default_threads()``).
    None when the backend is torch, when its runtime is not installed and nothing can stand in, or (with a
    warning) when the export itself fails: the caller then runs torch. ``use_cache_alone=False`` when the caller
    needs the torch model anyway (no fast tokenizer), so the cache look-up is left to ``load_or_export``.
    A graph that disagrees with torch raises ``RetrError``."""
    backend = get_backend(backend_name, kind)
    if not backend.exported:
        return None
    if backend.runtime == "openvino":
        vendor_telemetry_off()
        try:
            import openvino  # noqa: F401
        except ImportError:
            logger.warning("openvino is not installed: using the onnx backend")
            backend, calibration = BACKENDS["onnx"], None
    # the exporter's checks and the onnx runtimes need onnxruntime; a cached OpenVINO graph does not (~30 ms of a
    # one-query search not spent importing it)
    has_ort = importlib.util.find_spec("onnxruntime") is not None
    cached = use_cache_alone and (has_ort or backend.runtime != "onnxruntime")
    if cached and (graph := find_cached(model_hash, backend, kind, cache_root, threads, calibration)) is not None:
        return graph
    if not has_ort:
        logger.warning("onnxruntime is not installed: using the torch backend")
        return None
    try:
        return load_or_export(get_model, model_hash, backend, kind, max_length, cache_root, threads, calibration,
                              model_path, base=base)
    except RetrError:
        raise
    except Exception as e:  # noqa: BLE001 - an export failure must not stop the user
        logger.warning("%s export failed (%s): using the torch backend", kind.label, str(e).splitlines()[0][:200])
        return None
