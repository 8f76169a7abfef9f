"""Run a command as on this CPU without AMX: the kernel refuses AMX tile data to it and every process it starts.

    python benchmarks/without_amx.py python benchmarks/speed.py --sections 7 --fresh
    python benchmarks/without_amx.py retr doctor

A seccomp filter answers ``arch_prctl(ARCH_REQ_XCOMP_PERM)`` -- the request oneDNN (OpenVINO, PyTorch) makes before
its first AMX kernel -- with EPERM, as a container or an older kernel does, so every library falls back to its
AVX-512 kernels (bf16 through AVX512_BF16, int8 through VNNI). retr reads the refusal into its platform
(``platform.amx_granted``): candidates, priors and stored choices are those of a CPU with these flags but no AMX,
named "[AMX not granted by the kernel]" beside the CPU model. What stays this machine's: its cores, caches, clock
and memory -- a Xeon without AMX, not an EPYC. Linux x86-64 only; nothing else is changed.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
# the request retr (platform.amx_granted) and oneDNN make; written here, not imported: the launcher wraps any
# build, also an older one on its own PYTHONPATH that lacks these names
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM = 158, 0x1023
AUDIT_ARCH_X86_64 = 0xC000003E
LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
ALLOW, EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
# struct seccomp_data: nr at 0, arch at 4, args[0] at 16


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


FILTER = b"".join([
    _insn(LD_W_ABS, 0, 0, 4), _insn(JEQ_K, 1, 0, AUDIT_ARCH_X86_64), _insn(RET_K, 0, 0, ALLOW),
    _insn(LD_W_ABS, 0, 0, 0), _insn(JEQ_K, 0, 3, SYS_ARCH_PRCTL),
    _insn(LD_W_ABS, 0, 0, 16), _insn(JEQ_K, 0, 1, ARCH_REQ_XCOMP_PERM),
    _insn(RET_K, 0, 0, EPERM), _insn(RET_K, 0, 0, ALLOW),
])


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def refuse_amx() -> None:
    """Install the filter on this process (inherited by its children and kept across exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(FILTER)
    program = _Program(len(FILTER) // 8, ctypes.addressof(code))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise SystemExit(f"without_amx: seccomp refused (errno {ctypes.get_errno()})")


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__.strip().splitlines()[0] + "\nusage: python benchmarks/without_amx.py COMMAND...")
    refuse_amx()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
