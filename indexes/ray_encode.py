"""Documents encoded on a Ray cluster (``retr index --executor ray``).

The driver (this process) makes the plan a local build makes: the verified graph (calibrated where it applies) and
the documents' token ids, cut into the same length-sorted batches under the same token budget. Ray Data then
streams the batch numbers, in blocks, through ``map_batches`` on a pool of encoder actors. Each actor receives the
graph's files and the token ids once (one object in Ray's object store), checks the graph's checksums as the
local cache does, loads it once with as many inference threads as it holds CPUs, and for each batch builds the
same padded input a local build feeds the graph. The driver writes every returned row into its place and counts
it: a document that comes back twice or never is an error, not a silent gap.

Failures: Ray Data restarts a dead actor (its constructor runs again) and retries the tasks it held; a task's
rows reach the driver only once it succeeded, so the count check holds across a worker killed mid-job (tested).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retr.retrieval.backends.batching import attention_mask, length_batches, padded
from retr.retrieval.backends.export import EMBEDDING, Calibration
from retr.retrieval.backends.graphs import find_cached
from retr.retrieval.backends.registry import get_backend
from retr.retrieval.corpus_plan import CorpusPlan
from retr.retrieval.encoder import BiEncoder, CorpusEncoding
from retr.retrieval.errors import RetrError
from retr.retrieval.progress import Progress

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Plan:
    """Everything an actor needs, shipped once: the graph folder's files and the batches' token ids."""
    folder_name: str
    files: dict[str, bytes]  # path inside the graph folder -> its bytes
    model_hash: str
    backend: str
    calibration: str | None
    tokens: np.ndarray  # (total tokens,) int32: every document's ids, one after the other
    offsets: np.ndarray  # (n + 1,) int64: document i's ids are tokens[offsets[i]:offsets[i + 1]]
    order: np.ndarray  # (n,) int64: documents in batch order
    starts: np.ndarray  # (batches + 1,) int64: batch b is order[starts[b]:starts[b + 1]]
    widths: np.ndarray  # (batches,) int64: each batch's padded width


class _Rows:
    """Document ``i``'s token ids as a slice of the flat array (what ``padded`` indexes)."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        self.tokens, self.offsets = tokens, offsets

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


def _materialise(plan: _Plan) -> Path:
    """The graph folder under this node's temp dir (written once per node, atomically), as a cache root."""
    root = Path(tempfile.gettempdir()) / "retr-ray-graphs"
    folder = root / "onnx" / plan.folder_name
    if not folder.is_dir():
        (root / "onnx").mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{plan.folder_name}-", dir=root / "onnx"))
        for rel, data in plan.files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        try:
            tmp.rename(folder)
        except OSError:  # another actor on this node got there first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return root


class EncoderActor:
    """One encoder on a Ray worker: the verified graph loaded once, then batches by number."""

    def __init__(self, plan):
        import ray

        if isinstance(plan, ray.ObjectRef):  # Ray Data hands constructor arguments over unresolved
            plan = ray.get(plan)
        self.plan = plan
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        self.threads = max(1, int(cpus))
        calibration = Calibration((), plan.calibration) if plan.calibration else None
        backend = get_backend(plan.backend)
        # checked like the local cache: a folder left damaged on this node is discarded by find_cached, written again
        graph = None
        for _ in range(2):
            graph = find_cached(plan.model_hash, backend, EMBEDDING, _materialise(plan), self.threads, calibration)
            if graph is not None:
                break
        if graph is None:
            raise RuntimeError(f"the {plan.backend} graph shipped to this worker failed its checks")
        self.runner = graph.runner
        self.rows = _Rows(plan.tokens, plan.offsets)
        self.lengths = np.diff(plan.offsets)
        self.pid = os.getpid()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        p = self.plan

        def feeds():
            for b in batch["batch"].tolist():
                idx = p.order[p.starts[b]:p.starts[b + 1]]
                width = int(p.widths[b])
                yield idx, {"input_ids": padded(self.rows, idx, width, self.lengths),
                            "attention_mask": attention_mask(self.lengths[idx], width)}

        t0 = time.perf_counter()
        done = self.runner.run_batches(feeds())  # what a local build runs: the same call on the same feeds
        rows = np.concatenate([idx for idx, _ in done])
        emb = np.concatenate([out.reshape(len(idx), -1) for idx, out in done]).astype(np.float32, copy=False)
        busy = (time.perf_counter() - t0) / len(rows)  # this task's seconds, spread over its rows (sums back)
        return {"row": rows, "emb": emb, "pid": np.full(len(rows), self.pid, dtype=np.int64),
                "busy": np.full(len(rows), busy)}


def _graph_files(path: Path) -> tuple[str, dict[str, bytes]]:
    folder = path.parent
    return folder.name, {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def make_plan(encoder: BiEncoder, texts: list[str]) -> tuple[_Plan, CorpusPlan, int]:
    """The plan for ``texts``, the encoder's plan it ships (its graph, the texts' truncation) and the number of
    batches."""
    cplan = encoder.corpus_plan(texts)
    graph = cplan.graph
    if graph is None:
        raise RetrError("--executor ray runs an exported graph, and this encoder runs in torch: choose an exported "
                        "--backend (onnx, openvino, openvino-int8)")
    lengths = np.fromiter((len(t) for t in cplan.tokens), dtype=np.int64, count=len(cplan.tokens))
    batches = [(idx, width) for idx, width, _ in length_batches(lengths, encoder.config.token_budget)]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = (np.concatenate([np.asarray(t, dtype=np.int32) for t in cplan.tokens]) if len(lengths)
              else np.zeros(0, dtype=np.int32))
    starts = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum([len(idx) for idx, _ in batches], out=starts[1:])
    folder_name, files = _graph_files(graph.path)
    plan = _Plan(folder_name, files, encoder.model_hash, graph.backend.name, graph.calibration, tokens, offsets,
                 np.concatenate([idx for idx, _ in batches]) if batches else np.zeros(0, dtype=np.int64), starts,
                 np.asarray([w for _, w in batches], dtype=np.int64))
    return plan, cplan, len(batches)


def _connect(address: str | None) -> bool:
    """Join the cluster at ``address``, or start a Ray on this machine; True when this call started the session."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(address="local", logging_level=logging.WARNING, log_to_driver=False, include_dashboard=False)
    return True


def encode_on_ray(encoder: BiEncoder, texts: list[str], *, address: str | None = None, actors: int = 2,
                  cpus_per_actor: int = 1, batches_per_task: int = 4, on_block=None) -> CorpusEncoding:
    """``texts`` encoded by ``actors`` Ray actors (of ``cpus_per_actor`` CPUs each; ``batches_per_task`` encoding
    batches per task) on the cluster at ``address`` (None: a Ray started here); ``on_block(block)`` sees each
    block of rows as it arrives (``row``, ``emb``, ``pid``)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise RetrError("--executor ray needs Ray Data: pip install 'retr[ray]'") from None
    plan, cplan, n_batches = make_plan(encoder, texts)
    graph = cplan.graph
    n = len(texts)
    out = np.empty((n, encoder.dim), dtype=np.float32)
    if n == 0:
        return CorpusEncoding(out, graph.info(), {"name": "ray", "documents": 0}, cplan.truncation)
    started = _connect(address)
    ray.data.DataContext.get_current().enable_progress_bars = False  # retr's own progress reports the encoding
    seen = np.zeros(n, dtype=np.int32)
    pids: set[int] = set()
    busy = 0.0
    first_block = None
    t0 = time.perf_counter()
    try:
        plan_ref = ray.put(plan)  # kept referenced until the job ends: a restarted actor reads it again
        blocks = math.ceil(n_batches / batches_per_task)
        ds = ray.data.from_items([{"batch": b} for b in range(n_batches)], override_num_blocks=blocks).map_batches(
            EncoderActor, fn_constructor_args=(plan_ref,), batch_size=batches_per_task, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus_per_actor)
        with Progress(n, "encoding on ray", unit="doc") as bar:
            for block in ds.iter_batches(batch_size=None, batch_format="numpy"):
                rows = block["row"]
                out[rows] = block["emb"]
                np.add.at(seen, rows, 1)
                pids.update(block["pid"].tolist())
                busy += float(block["busy"].sum())
                if first_block is None:
                    first_block = time.perf_counter() - t0
                if on_block is not None:
                    on_block(block)
                bar.update(len(rows))
    finally:
        if started:
            ray.shutdown()
    seconds = time.perf_counter() - t0
    wrong = np.flatnonzero(seen != 1)
    if len(wrong):
        raise RetrError(f"the Ray encoding returned {int((seen == 0).sum())} documents never and "
                        f"{int((seen > 1).sum())} more than once (first: row {int(wrong[0])}): nothing was written")
    logger.info("encoded %d texts on Ray: %d actors, %d batches in %d blocks, %.1f s", n, actors, n_batches,
                blocks, seconds)
    return CorpusEncoding(out, graph.info(), {
        "name": "ray", "address": address, "actors": actors, "cpus_per_actor": cpus_per_actor,
        "batches": n_batches, "blocks": blocks, "actor_processes": len(pids), "seconds": seconds,
        # encoding time inside the actors, and the wait for the first block (cluster join, actors, graph load)
        "actor_busy_seconds": busy, "first_block_seconds": first_block}, cplan.truncation)
