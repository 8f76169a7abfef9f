"""Runners: a graph file compiled by ONNX Runtime or OpenVINO, called with ``{input name: int64 array}``."""

from __future__ import annotations

import functools
import os
import queue
import threading
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, from /proc/cpuinfo (read once); empty where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(flag for line in text.splitlines() if line.startswith("flags")
                     for flag in line.split(":", 1)[-1].split())


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX), from /proc/cpuinfo; False elsewhere.
    The one check for training (bf16 autocast) and inference (OpenVINO's precision hint). ``RETR_BF16=0`` / ``1``
    overrides the reading (fp32 graphs and training on a bf16 CPU: the figures of an fp32 machine, measured here)."""
    forced = os.environ.get("RETR_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    return not _cpu_flags().isdisjoint({"avx512_bf16", "amx_bf16"})


def cpu_has_int8_dot() -> bool:
    """Whether this CPU multiplies int8 in one instruction (AVX-512 VNNI, AVX-VNNI or AMX), from /proc/cpuinfo."""
    return not _cpu_flags().isdisjoint({"avx512_vnni", "avx_vnni", "amx_int8"})


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles for bf16 (Intel Sapphire Rapids and later), from /proc/cpuinfo."""
    return "amx_bf16" in _cpu_flags()


def int8_pays() -> bool:
    """Whether static int8 graphs run faster than the base graph on this CPU: with int8 dot products and without
    AMX. Without int8 dot products (AVX2 alone) int8 is slower: MiniLM documents through OpenVINO at 19.2 docs/s
    in int8 against 22.7 in fp32 on an AVX2 EPYC. With AMX its bf16 tiles make the bf16 graph as fast: 104.5 docs/s
    in int8 against 107.6 in bf16 on an AMX Xeon, and a new 1,000-document corpus indexed in 15.5 s against 12.0 s
    (`benchmarks/graph_speed.py`, `benchmarks/speed.py --sections 7`; README, "First run on a new corpus"). Where
    it pays (AVX-512 VNNI or AVX-VNNI without AMX): 3.4x sentence-transformers against 2.6x for bf16. With graphs of
    export generation 3 (fused attention) the AMX Xeon's int8 graph alone encodes 122.8 docs/s against 90.2 for
    bf16, but a new 1,000-document corpus, whole process, still indexes faster in bf16: 8.69 s against 10.31 s.
    ``RETR_INT8_DOT=1`` / ``0`` overrides the reading (tests; benchmarks that time int8 anyway)."""
    forced = os.environ.get("RETR_INT8_DOT")
    if forced in ("0", "1"):
        return forced == "1"
    return cpu_has_int8_dot() and not cpu_has_amx()


def native_precision() -> str:
    """bf16 where the CPU has native bf16, else fp32: what OpenVINO graphs run in."""
    return "bf16" if cpu_has_bf16() else "fp32"


def cpu_kind() -> str:
    """What decides an exported graph's numbers on this CPU: its native precision, ``+int8`` where static int8
    graphs are used (``bf16+int8``, ``bf16``, ``fp32+int8``, ``fp32``). Expected scores are recorded per kind."""
    return native_precision() + ("+int8" if int8_pays() else "")


def default_threads() -> int:
    """Inference threads: the machine's cores, at most 4 (one policy for every runner)."""
    return max(1, min(os.cpu_count() or 1, 4))


class OrtRunner:
    """An ONNX Runtime session with retr's thread policy; batches run one after the other. Safe to call from
    several threads at once (ONNX Runtime's ``run`` is)."""

    parallel = 1  # batches in flight in run_batches

    def __init__(self, path: Path, threads: int, precision: str = "fp32"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.precision = precision

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
    """An OpenVINO model compiled once, for throughput: one stream per thread, each on its own core (no
    synchronisation inside a batch; +20-27% docs/s on 2 cores against one two-thread stream). Batches run
    ``parallel`` at a time; single calls (queries) each take an idle request, so concurrent callers (a server's
    search threads) run side by side on the streams: 246 against 150 queries/s on 2 cores, for 7.6 against 6.2 ms
    for a lone query (MiniLM bf16, measured). Documents and queries go through the same compiled graph."""

    def __init__(self, path: Path, threads: int, precision: str = "fp32"):
        import openvino as ov

        self.precision = precision
        self._model = ov.Core().read_model(str(path))  # kept: the folder may be renamed once verified
        self._precision_hint = "bf16" if "bf16" in precision else "f32"
        self._compiled = None  # compiled on first use: a search whose queries take another graph never pays it
        self._threads = threads
        self.parallel = max(1, threads)  # streams, one thread each
        # OpenVINO pins its streams' threads to cores counted from the first: two processes of one stream each (two
        # Ray actors on two cores) then share core 0 and run at half speed (measured: 15.8 s against 7.5 s for the
        # same work). Pinning is left on only for a runner that has every core of the machine to itself.
        self._pin = threads >= (os.cpu_count() or 1)
        self._queue = None
        self._idle = queue.SimpleQueue()  # infer requests for single calls, created up to ``parallel``
        self._made = 0
        self._lock = threading.Lock()  # compiling, and one batch run at a time

    @property
    def compiled(self):
        with self._lock:
            if self._compiled is None:
                import openvino as ov

                self._compiled = ov.Core().compile_model(self._model, "CPU", {
                    "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": self.parallel,
                    "INFERENCE_NUM_THREADS": self._threads, "INFERENCE_PRECISION_HINT": self._precision_hint,
                    "ENABLE_CPU_PINNING": self._pin})
            return self._compiled

    def _take(self):
        """An idle request: a new one while fewer than ``parallel`` exist, else the next one handed back."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            make = self._made < self.parallel
            self._made += int(make)
        return self.compiled.create_infer_request() if make else self._idle.get()

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        request = self._take()
        try:
            request.infer(feeds)
            return request.get_output_tensor(0).data.copy()  # the request's buffer is reused by the next call
        finally:
            self._idle.put(request)

    def run_batches(self, items, on_done=None) -> list:
        """``[(key, output)]`` for an iterable of ``(key, feeds)``, ``parallel`` batches in flight (in completion
        order; ``on_done(key)`` is called from OpenVINO's threads)."""
        compiled = self.compiled
        with self._lock:
            if self._queue is None:
                import openvino as ov

                self._queue = ov.AsyncInferQueue(compiled, self.parallel)
            return self._run_batches(self._queue, items, on_done)

    @staticmethod
    def _run_batches(requests, items, on_done) -> list:
        done = []

        def finished(request, key):
            done.append((key, request.get_output_tensor(0).data.copy()))
            if on_done is not None:
                on_done(key)

        requests.set_callback(finished)
        for key, feeds in items:
            requests.start_async(feeds, key)  # waits for a free request when all are busy
        requests.wait_all()
        return done


RUNTIMES = {"onnxruntime": OrtRunner, "openvino": OpenVinoRunner}
