"""The machine retr runs on, as one value: resolved once per process and passed down.

Training precision, the graphs' precision, expected-score filtering and the backend chooser all read one
``Platform`` instead of each reading ``/proc/cpuinfo`` again. Flags only say what cannot run (natively) here;
which graph is fastest is measured on the machine (``backends.chooser``). ``RETR_BF16=0/1`` and
``RETR_INT8_DOT=0/1`` stay overrides (the figures of another kind of machine, measured on this one). Whether bf16
is used where it is native is measured too (``precision``): without AMX it can be slower than fp32.

A flag is only what the CPU has; what a process may use can be less. Two limits are read into the flags:
AMX needs the kernel to grant tile data (``arch_prctl(ARCH_REQ_XCOMP_PERM)``; containers and older kernels refuse
it, and oneDNN, so OpenVINO and PyTorch, then run without it), and ``ONEDNN_MAX_CPU_ISA`` caps the instructions
OpenVINO's and PyTorch's kernels use (on an AMX Xeon, ``AVX512_CORE_BF16`` made the bf16 MiniLM graph 3.8x
slower: 869 against 227 ms for 32x128 tokens). Either limit is named in ``Platform.cpu``, so choices measured
under it are stored apart.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform as _platform
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retr.retrieval.backends.precision import PrecisionTiming

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
AMX_FLAG = "amx_bf16"
AMX_FLAGS = frozenset({"amx_bf16", "amx_int8", "amx_tile", "amx_fp16", "amx_complex"})
AVX512_BF16_UP = frozenset({"avx512_bf16", "avx512_fp16"})
# Linux x86-64: the request for AMX tile data a process makes before its first AMX instruction
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18


def _avx512(flags: frozenset[str]) -> frozenset[str]:
    return frozenset(f for f in flags if f.startswith("avx512"))


# ONEDNN_MAX_CPU_ISA: the flags each ceiling takes away (oneDNN's names; a value not listed takes nothing away)
ISA_CEILINGS = {
    "AVX512_CORE_FP16": lambda f: AMX_FLAGS,
    "AVX512_CORE_BF16": lambda f: AMX_FLAGS,
    "AVX512_CORE_VNNI": lambda f: AMX_FLAGS | AVX512_BF16_UP,
    "AVX512_CORE": lambda f: AMX_FLAGS | AVX512_BF16_UP | {"avx512_vnni"},
    "AVX2_VNNI_2": lambda f: AMX_FLAGS | _avx512(f),
    "AVX2_VNNI": lambda f: AMX_FLAGS | _avx512(f),
    "AVX2": lambda f: AMX_FLAGS | _avx512(f) | {"avx_vnni"},
    "AVX": lambda f: AMX_FLAGS | _avx512(f) | {"avx_vnni", "avx2"},
    "SSE41": lambda f: AMX_FLAGS | _avx512(f) | {"avx_vnni", "avx2", "avx"},
}


def _forced(name: str) -> bool | None:
    value = os.environ.get(name)
    return value == "1" if value in ("0", "1") else None


@dataclass(frozen=True)
class Platform:
    """A CPU as retr's choices see it. Build one with ``Platform.of`` (tests: any flags) or ``this_platform()``."""
    cpu: str  # the model name string ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8481C"): part of every choice's key
    flags: frozenset[str] = field(default_factory=frozenset)
    cores: int = 1
    bf16_forced: bool | None = None  # RETR_BF16
    int8_forced: bool | None = None  # RETR_INT8_DOT
    precision_probe: PrecisionTiming | None = None  # bf16 against fp32, measured here (``precision``)

    @classmethod
    def of(cls, flags, cpu: str = "simulated", cores: int = 2, bf16_forced: bool | None = None,
           int8_forced: bool | None = None) -> Platform:
        return cls(cpu, frozenset(flags), max(1, int(cores)), bf16_forced, int8_forced)

    @property
    def bf16_native(self) -> bool:
        """bf16 instructions here (AVX-512 BF16 or AMX): whether bf16 is a candidate at all."""
        return not self.flags.isdisjoint(BF16_FLAGS)

    @property
    def bf16(self) -> bool:
        """Whether retr computes in bf16 here (training autocast, OpenVINO's precision hint): native bf16 that the
        probe measured faster than fp32 (``precision``; flags alone where it was not run), or ``RETR_BF16``."""
        if self.bf16_forced is not None:
            return self.bf16_forced
        if self.precision_probe is not None:
            return self.bf16_native and self.precision_probe.bf16_pays
        return self.bf16_native

    @property
    def int8_dot(self) -> bool:
        """int8 multiplies in one instruction (AVX-512 VNNI, AVX-VNNI, AMX); without them int8 MatMuls are
        emulated (AVX2: MiniLM at 19.2 docs/s in int8 against 22.7 in fp32 on an AVX2 EPYC)."""
        return self.int8_forced if self.int8_forced is not None else not self.flags.isdisjoint(INT8_DOT_FLAGS)

    @property
    def amx(self) -> bool:
        return AMX_FLAG in self.flags

    @property
    def precision(self) -> str:
        """What OpenVINO graphs compute in here: bf16 where native, else fp32."""
        return "bf16" if self.bf16 else "fp32"

    @property
    def static_int8(self) -> bool:
        """Whether static int8 graphs are candidates here at all (native int8 dot products, or forced); whether
        a corpus then pays for their calibration is measured (``cost.calibration_pays``)."""
        return self.int8_dot

    @property
    def int8_prior(self) -> float:
        """Static int8's document throughput over the base graph's, assumed until measured here
        (``cost.int8_prior``: the priors and their sources are data, ``priors.json``)."""
        from retr.retrieval.backends.cost import int8_prior

        return int8_prior(self)

    @property
    def weights_prior(self) -> float:
        """The int8-weights graph's document throughput over the base graph's, assumed until measured here
        (``cost.weights_prior``)."""
        from retr.retrieval.backends.cost import weights_prior

        return weights_prior(self)

    @property
    def kind(self) -> str:
        """Which table of expected scores applies here: the precision, ``+int8`` where static int8 is expected to
        pay (``int8_prior`` > 1: ``bf16+int8``, ``bf16``, ``fp32+int8``, ``fp32``)."""
        return self.precision + ("+int8" if self.static_int8 and self.int8_prior > 1 else "")

    @property
    def threads(self) -> int:
        """Inference threads: the machine's cores, at most 4 (one policy for every runner)."""
        return thread_count(self.cores)

    def to_dict(self) -> dict:
        return {"cpu": self.cpu, "cores": self.cores, "threads": self.threads, "precision": self.precision,
                "bf16": self.bf16, "bf16_native": self.bf16_native,
                "precision_probe": self.precision_probe.to_dict() if self.precision_probe else None,
                "int8_dot": self.int8_dot, "amx": self.amx, "kind": self.kind,
                "avx512": any(f.startswith("avx512") for f in self.flags), "avx2": "avx2" in self.flags}


def thread_count(cores: int | None = None) -> int:
    """Threads for work spread over the cores (``cores``: this machine's): at most 4, the one policy of every
    runner and of the tokenizer's threads."""
    return max(1, min(cores if cores is not None else os.cpu_count() or 1, 4))


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return _platform.processor() or _platform.machine() or "unknown", frozenset()
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return model or _platform.processor() or _platform.machine() or "unknown", flags


@functools.lru_cache(maxsize=1)
def amx_granted() -> bool:
    """Whether the kernel lets this process use AMX tile data (Linux x86-64 asks for it per process; the request
    is the same one oneDNN makes before its first AMX kernel). Other systems: assumed, as their flags say."""
    if _platform.system() != "Linux" or _platform.machine() not in ("x86_64", "AMD64"):
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return True


def usable_flags(flags: frozenset[str], ceiling: str | None, granted) -> tuple[frozenset[str], list[str]]:
    """The flags a process may use, and the limits that took some away (named in ``Platform.cpu``).
    ``granted`` is asked only where AMX flags are present."""
    limits = []
    if not flags.isdisjoint(AMX_FLAGS) and not granted():
        flags, limits = flags - AMX_FLAGS, ["AMX not granted by the kernel"]
    ceiling = (ceiling or "").strip().upper()
    taken = ISA_CEILINGS[ceiling](flags) & flags if ceiling in ISA_CEILINGS else frozenset()
    if taken:
        flags, limits = flags - taken, limits + [f"ONEDNN_MAX_CPU_ISA={ceiling}"]
    return flags, limits


def this_platform() -> Platform:
    """This machine: ``/proc/cpuinfo`` (read once per process) less what this process may not use (the kernel's
    AMX grant, ``ONEDNN_MAX_CPU_ISA``), the core count, whether bf16 is faster than fp32 here (measured once per
    CPU and stored: ``precision.timing``, where bf16 is native and not forced) and the ``RETR_BF16`` /
    ``RETR_INT8_DOT`` overrides."""
    cpu, flags = _cpuinfo()
    flags, limits = usable_flags(flags, os.environ.get("ONEDNN_MAX_CPU_ISA"), amx_granted)
    if limits:
        cpu = f"{cpu} [{'; '.join(limits)}]"
    here = Platform(cpu, flags, max(1, os.cpu_count() or 1), _forced("RETR_BF16"), _forced("RETR_INT8_DOT"))
    if here.bf16_native and here.bf16_forced is None:
        from retr.retrieval.backends import precision  # OpenVINO's probe: only where bf16 is a candidate

        here = replace(here, precision_probe=precision.timing(cpu, here.threads))
    return here


__all__ = ["Platform", "amx_granted", "thread_count", "this_platform", "usable_flags"]
