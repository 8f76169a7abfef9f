"""Whether bf16 is faster than fp32 on this CPU: measured, once per CPU, thread count and OpenVINO version, and
stored, because a bf16 flag does not say so.

An AMX Xeon runs a transformer's feed-forward matrices ~2.5x faster in bf16 than in fp32; the same Xeon with AMX
refused (``benchmarks/without_amx.py``), its AVX512_BF16 instructions still there, ran them ~1.8x *slower* in
bf16, and MiniLM's graph ~2x slower (706-869 against 383 ms for 32x128 tokens). The probe is two of MiniLM's
feed-forward blocks (384 -> 1536 -> 384, 512 token rows) compiled by OpenVINO in both precisions and timed in
alternation (~0.4 s; ~0.8 s in the child process it runs in). bf16 is taken only where it is more than
``NOISE_FREE_MARGIN`` faster: it adds ranking noise that fp32 does not.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import subprocess
import sys
from dataclasses import asdict, dataclass

from retr.retrieval.artifacts import cache_home, versions
from retr.retrieval.backends.quiet import vendor_telemetry_off
from retr.retrieval.backends.timing import (
    NOISE_FREE_MARGIN,
    faster_enough,
    read_stored,
    recorded,
    store,
    time_alternating,
)

logger = logging.getLogger(__name__)

PROBE_ROWS, PROBE_WIDTH, PROBE_FFN, PROBE_LAYERS = 512, 384, 1536, 2
PROBE_MACS = PROBE_ROWS * PROBE_LAYERS * 2 * PROBE_WIDTH * PROBE_FFN  # one call's multiply-adds
PROBE_BUDGET_S = 0.1
PROBE_VERSION = 1  # another probe, other stored measurements


@dataclass(frozen=True)
class PrecisionTiming:
    """The probe's milliseconds in bf16 and fp32 on this CPU."""
    bf16_ms: float
    fp32_ms: float

    @property
    def bf16_pays(self) -> bool:
        """bf16 adds ranking noise that fp32 does not: taken as any such graph is (``timing.faster_enough``)."""
        return faster_enough(self.fp32_ms, self.bf16_ms)

    def phrase(self) -> str:
        return (f"bf16 {self.bf16_ms:.1f} ms, fp32 {self.fp32_ms:.1f} ms on two feed-forward blocks: "
                + ("bf16" if self.bf16_pays else f"fp32 (bf16 not more than {NOISE_FREE_MARGIN:.0%} faster)"))

    def to_dict(self) -> dict:
        return {**asdict(self), "bf16_pays": self.bf16_pays, "margin": NOISE_FREE_MARGIN}

    def macs_per_second(self, precision: str) -> float:
        """Multiply-adds per second of the probe's matrices in ``precision`` (``bf16`` or ``fp32``): large
        matrices, all threads on one call, the rate a transformer's layers approach and do not pass."""
        ms = self.bf16_ms if precision == "bf16" else self.fp32_ms
        return PROBE_MACS / max(ms / 1000, 1e-9)


def _probe_model():
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(0)
    x = ops.parameter([PROBE_ROWS, PROBE_WIDTH], ov.Type.f32, name="x")
    h = x
    for _ in range(PROBE_LAYERS):
        up = (rng.standard_normal((PROBE_WIDTH, PROBE_FFN)) * 0.05).astype(np.float32)
        down = (rng.standard_normal((PROBE_FFN, PROBE_WIDTH)) * 0.05).astype(np.float32)
        a = ops.gelu(ops.matmul(h, ops.constant(up), False, False), "erf")
        h = ops.add(h, ops.matmul(a, ops.constant(down), False, False))
    return ov.Model([h], [x], "retr-precision-probe")


def measure(threads: int) -> PrecisionTiming:
    """The probe, timed now: bf16 and fp32 compiled from one model, alternating."""
    vendor_telemetry_off()
    import numpy as np
    import openvino as ov

    core = ov.Core()
    x = np.random.default_rng(1).standard_normal((PROBE_ROWS, PROBE_WIDTH)).astype(np.float32)
    runs = []
    for hint in ("bf16", "f32"):
        request = core.compile_model(_probe_model(), "CPU", {
            "INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
        }).create_infer_request()
        runs.append(functools.partial(request.infer, {0: x}))
    bf16_s, fp32_s = time_alternating(runs, 1, budget_s=PROBE_BUDGET_S, min_rounds=3)
    return PrecisionTiming(bf16_s * 1000, fp32_s * 1000)


def measure_apart(threads: int) -> PrecisionTiming:
    """``measure`` in a child process, so that the probe's compiled models, OpenVINO's caches for them and their
    peak stay out of this one (in-process, a first `retr eval` on an AMX Xeon peaked 15 MiB higher: 540-541
    against 525-526 MiB); in this process where a child cannot be started (~0.4 s less)."""
    code = ("import json, sys; from retr.retrieval.backends.precision import measure; "
            "t = measure(int(sys.argv[1])); print(json.dumps([t.bf16_ms, t.fp32_ms]))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(threads)], capture_output=True, text=True,
                              timeout=120, check=True)
        bf16_ms, fp32_ms = json.loads(proc.stdout.strip().splitlines()[-1])
        return PrecisionTiming(float(bf16_ms), float(fp32_ms))
    except (OSError, ValueError, IndexError, TypeError, subprocess.SubprocessError) as e:
        logger.debug("precision probe in a child failed (%s): measured in this process", e)
        return measure(threads)


def _key(cpu: str, threads: int) -> str:
    ov_version = versions().get("openvino", "not installed")
    raw = json.dumps([PROBE_VERSION, cpu, threads, ov_version, NOISE_FREE_MARGIN])
    return "precision-" + hashlib.sha256(raw.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=8)
def timing(cpu: str, threads: int) -> PrecisionTiming | None:
    """This CPU's probe: read from ``$RETR_CACHE/choices`` where it was measured before, else measured now (in a
    child process, once per process) and stored. None where OpenVINO cannot run it (not installed, another
    device): the flags then decide."""
    path = cache_home() / "choices" / f"{_key(cpu, threads)}.json"
    stored = read_stored(path, _stored, "precision probe", "measured again")
    if stored is not None:
        return stored
    try:
        measured = measure_apart(threads)
    except Exception as e:  # noqa: BLE001 - OpenVINO missing or refusing the probe: the flags decide
        logger.debug("precision probe not run: %s", e)
        return None
    logger.info("bf16 or fp32 on this CPU (%s, once): %s", cpu, measured.phrase())
    store(path, {**measured.to_dict(), "cpu": cpu, "threads": threads})
    return measured


def _stored(d: dict) -> PrecisionTiming:
    """A stored probe; ``ValueError`` where a time is NaN, 0, negative or not a number (a damaged file)."""
    return PrecisionTiming(recorded(d["bf16_ms"], positive=True), recorded(d["fp32_ms"], positive=True))

__all__ = ["NOISE_FREE_MARGIN", "PrecisionTiming", "measure", "measure_apart", "timing"]
