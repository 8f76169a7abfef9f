"""Runners: a graph file compiled by ONNX Runtime or OpenVINO, called with ``{input name: int64 array}``."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from retr.retrieval.artifacts import cache_home
from retr.retrieval.backends.compiled import CompiledStore
from retr.retrieval.backends.platform import this_platform
from retr.retrieval.backends.quiet import vendor_telemetry_off
from retr.retrieval.errors import RetrError


def default_threads() -> int:
    """Inference threads: the machine's cores, at most 4 (one policy for every runner; ``Platform.threads``)."""
    return this_platform().threads


def row_width(dims) -> int | None:
    """The width of a graph's output rows from its declared dimensions (1: one score per row, a rank-1 output);
    None where the last is not fixed (a name, or unknown)."""
    if len(dims) == 1:
        return 1
    return dims[-1] if dims and isinstance(dims[-1], int) else None


class OrtRunner:
    """An ONNX Runtime session with retr's thread policy; batches run one after the other. Safe to call from
    several threads at once (ONNX Runtime's ``run`` is). The session is made on first use, as an OpenVINO model
    is compiled on first use: a cached graph that is only a candidate (a stored choice took another) costs nothing
    (MiniLM's onnx and onnx-int8 sessions, opened by every search once made: +197 MiB and ~0.5 s)."""

    parallel = 1  # batches in flight in run_batches
    lone_multiple = 1  # a text alone runs at its own length (``batching.lone_feed``): a new length costs nothing

    def __init__(self, path: Path, threads: int, precision: str = "fp32"):
        self._path = path
        self._threads = threads
        self.precision = precision
        self._session = None
        self._lock = threading.Lock()
        # (the output width its cache entry records, what to do where the session declares another: discard the
        # entry), checked when the session is made (``expect_width``); an OpenVINO runner's is ``output_width``
        self._expected: tuple[int, Callable[[str], None]] | None = None

    def expect_width(self, width: int, damaged: Callable[[str], None]) -> None:
        """Check, when the session is made, that its output rows are ``width`` wide as declared in the file (1: one
        score per row); where they are not, call ``damaged(why)`` and raise a ``RetrError``."""
        self._expected = (width, damaged)

    def _check_width(self, session) -> None:
        if self._expected is None:
            return
        width, damaged = self._expected
        declared = row_width(session.get_outputs()[0].shape)
        if declared is not None and declared != width:
            why = f"its graph gives {declared}-wide outputs, its manifest says {width}"
            damaged(why)
            raise RetrError(f"{self._path.parent}: {why}: the cached graph was discarded; run the command again "
                            f"to make it anew")

    @property
    def session(self):
        session = self._session
        if session is not None:  # every query's path: no lock once made
            return session
        with self._lock:
            if self._session is None:
                import onnxruntime as ort

                so = ort.SessionOptions()
                so.intra_op_num_threads = self._threads
                so.inter_op_num_threads = 1
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                so.log_severity_level = 3
                session = ort.InferenceSession(str(self._path), so, providers=["CPUExecutionProvider"])
                self._check_width(session)
                self._session = session
            return self._session

    def moved(self, path: Path) -> None:
        """Its file now lives at ``path`` (a graph made in a temporary folder, then published in one rename): a
        session made again after ``release`` reads it there, not from the temporary folder, which is gone."""
        self._path = path

    def release(self) -> bool:
        """Drop the session (made again on next use). Whether there was one to drop."""
        with self._lock:
            held, self._session = self._session is not None, None
            return held

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


# the cache's folder of compiled query graphs (``OpenVinoRunner.keep_compiled``, ``compiled.CompiledStore``)
COMPILED = "compiled"

# after a single call overflowed from a one-stream runner onto its streams, further calls stay on the streams for
# this long: a loaded server then runs one query per core throughout, instead of a query on the one stream's every
# thread with another on a stream beside it (three threads on two cores)
OVERFLOW_HOLD_S = 0.5


class OpenVinoRunner:
    """An OpenVINO model compiled once, for throughput: one stream per thread, each on its own core (no
    synchronisation inside a batch; +20-27% docs/s on 2 cores against one two-thread stream). Batches run
    ``parallel`` at a time; single calls (queries) each take an idle request, so concurrent callers (a server's
    search threads) run side by side on the streams: 246 against 150 queries/s on 2 cores, for 7.6 against 6.2 ms
    for a lone query (MiniLM bf16, measured). Documents and queries go through the same compiled graph."""

    # a text alone (a query) is padded to a multiple of this many tokens (``batching.lone_feed``; where the
    # padding cannot change its vector: ``Backend.batch_invariant``). OpenVINO compiles kernels for each sequence
    # length the first time it meets it, and plans every node again when the length differs from the last call's:
    # MiniLM's static int8 graph on 2 cores of an AVX-512 EPYC, a lone query 11.6 ms at a new length against 2.6
    # ms at one met before, and 3.3 against 2.8 ms (bf16) where the length changed from the last query's. 100
    # SciFact queries after 5 (benchmarks/speed.py's section 2), three alternating rounds: p50 2.57-2.75 against
    # 3.00-3.90 ms unpadded, p95 3.7-3.8 against 13.2-14.3 (4 tokens: p50 2.56-3.42, p95 10.5-12.1)
    lone_multiple = 8

    def __init__(self, path: Path, threads: int, precision: str = "fp32", streams: int | None = None,
                 model=None, overflow: OpenVinoRunner | None = None):
        vendor_telemetry_off()
        import openvino as ov

        self.precision = precision
        # kept: the folder may be renamed once verified; ``model``: another runner's, shared (``one_stream``)
        self._model = model if model is not None else ov.Core().read_model(str(path))
        self._path = path
        self._precision_hint = "bf16" if "bf16" in precision else "f32"
        self._compiled = None  # compiled on first use: a search whose queries take another graph never pays it
        self._threads = threads
        self.parallel = max(1, streams or threads)  # streams (default: one thread each)
        # OpenVINO pins its streams' threads to cores counted from the first: two processes of one stream each (two
        # Ray actors on two cores) then share core 0 and run at half speed (measured: 15.8 s against 7.5 s for the
        # same work). Pinning is left on only for a runner that has every core of the machine to itself.
        self._pin = threads >= (os.cpu_count() or 1)
        self._queue = None
        self._idle = queue.SimpleQueue()  # infer requests for single calls, created up to ``parallel``
        self._made = 0
        self._lock = threading.Lock()  # compiling, and one batch run at a time
        # ``one_stream``'s: the runner a single call takes while another single call is in flight here
        self._overflow = overflow
        self._active = 0  # single calls in flight (counted where there is an overflow runner)
        self._streams_until = 0.0  # time.monotonic() before which single calls take the overflow runner
        self._active_lock = threading.Lock()
        # where this compiled model is kept for the next process (``keep_compiled``), or None
        self._kept: CompiledStore | None = None

    @property
    def output_width(self) -> int | None:
        """The width of the model's output rows as its file declares it (1: one score per row), or None where
        it is not fixed there."""
        shape = self._model.output(0).get_partial_shape()
        if not shape.rank.is_static:
            return None
        return row_width([d.get_length() if d.is_static else None for d in shape])

    def one_stream(self) -> OpenVinoRunner:
        """The same model compiled as one stream over all of this runner's threads: for a lone query, the cores
        work on it together (MiniLM bf16, 2 AVX-512 EPYC cores: ~2.6 against ~5.2 ms a query through two streams).
        Concurrent queries would then wait for each other: a single call made while another is in flight through
        the one stream takes this runner's streams instead (compiled again where they were released), and so do the
        calls made within ``OVERFLOW_HOLD_S`` of one that did. `retr serve` on 2 AMX Xeon cores, means of four
        alternating runs, 1 / 32 clients: 111 / 152 queries/s, against 116 / 122 on the one stream alone and
        83 / 158 on the streams alone (benchmarks/results/serve-overflow-hold-amx.json). The same file in the same
        precision: the streams compute what the one stream does. A query candidate the chooser times
        (``retrieval.query_graphs``); the model is shared, not read again."""
        return OpenVinoRunner(self._path, self._threads, self.precision, streams=1, model=self._model, overflow=self)

    def moved(self, path: Path) -> None:
        """Its file now lives at ``path`` (published in one rename; the model itself is in memory already)."""
        self._path = path

    def keep_compiled(self, source: Path, cpu: str) -> None:
        """Keep the model compiled from now on in the cache (``COMPILED``) for the next process, which reads it back
        instead of compiling it where that was measured faster (``compiled.CompiledStore``; the query graph a search
        takes, not every candidate timed). ``source``: the graph's cache folder; ``cpu``: the CPU it runs on."""
        self._kept = CompiledStore(cache_home() / COMPILED, Path(source), cpu)

    def release(self) -> bool:
        """Drop the compiled model and its requests, compiled again on next use: for a documents' graph whose
        queries go through another graph (`retr eval` on an AMX Xeon: peak 593 -> 493 MiB, with the freed heap
        handed back). Whether there was one to drop."""
        with self._lock:
            held = self._compiled is not None
            self._compiled = None
            self._queue = None
            self._idle = queue.SimpleQueue()
            self._made = 0
            return held

    def compile_config(self) -> dict:
        """What the model is compiled with: its streams, threads, precision and pinning."""
        return {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": self.parallel,
                "INFERENCE_NUM_THREADS": self._threads, "INFERENCE_PRECISION_HINT": self._precision_hint,
                "ENABLE_CPU_PINNING": self._pin}

    @property
    def compiled(self):
        with self._lock:
            if self._compiled is None:
                import openvino as ov

                core, config = ov.Core(), self.compile_config()
                self._compiled = (self._kept.compile(core, self._model, config) if self._kept is not None
                                  else core.compile_model(self._model, "CPU", config))
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
        if self._overflow is None:
            return self._infer(feeds)
        with self._active_lock:
            now = time.monotonic()
            if self._active:  # another call in flight: this one and those made soon after take the streams
                self._streams_until = now + OVERFLOW_HOLD_S
            alone = now >= self._streams_until  # (a lone caller's calls never overlap: the hold then runs out)
            self._active += 1
        try:
            return self._infer(feeds) if alone else self._overflow(feeds)
        finally:
            with self._active_lock:
                self._active -= 1

    def _infer(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        request = self._take()
        try:
            # copied into the request's own tensors. Handing the request tensors of its own instead (the caller's
            # arrays shared, ``share_inputs``, or copied into new ``ov.Tensor``s: a lone query ~0.1 ms faster of
            # ~2.2) crashed 2 of 5 and 2 of 8 first `retr index` runs of 1,000 documents on an empty cache, a
            # segfault in Python code while the same compiled model ran batches on its other requests (OpenVINO
            # 2026.4; copying: 16 of 16 ran, as 8 of 8 at the build before)
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
