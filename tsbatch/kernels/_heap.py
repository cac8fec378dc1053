"""Freed heap memory kept for the next evaluation (glibc's ``malloc``).

An evaluation's numpy temporaries are mostly one column of the batch each
(30,186 FlexAttention rows: 236 KiB arrays, ~40 MiB live at the peak of the
lowering). glibc serves them from the heap and, when they are freed at the end
of the call, returns the free top of the heap to the system (``brk``) once it
exceeds its trim threshold. glibc raises that threshold by itself to twice the
largest block it has unmapped (``mallopt(3)``: the dynamic mmap threshold),
a few MiB in a tsbatch process; so a call whose temporaries lie at the top of
the heap gives them back and the next call takes them again, page by page
(~8,800 minor page faults, 35 MiB, per warm 30k-row attention call). Whether
they lie at the top is the luck of what else the process allocated around them:
numba's full load of a cached kernel (LLVM bitcode parsed into a module that
lives on) used to leave long-lived blocks above them; the machine-code-only load
(:mod:`tsbatch.kernels._fastload`) does not.

:func:`keep_freed_heap` sets, once per process and at the first evaluation,
the two thresholds: a 32 MiB mmap threshold (the ceiling of glibc's own dynamic
rule: blocks up to 32 MiB come from the heap) and a trim threshold of 256 MiB,
so that up to 256 MiB of free heap top stay with the process between calls.
glibc's dynamic rule would end at twice the mmap threshold, 64 MiB, which holds
a 30k-row call's temporaries but not a 100k-row one's: warm ``evaluate`` of the
100k-row tables of ``bench/family_speed.py`` took 17-26k minor page faults a
call at 64 MiB (66-101 MiB; 0.04-0.05 s of system time, a third of a 0.15 s
attention or norms call) and 0-450 at 256 MiB (session 17: attention 0.157 ->
0.108 s, rowwise 0.150 -> 0.107, moe_ep 0.153 -> 0.120, GEMM 0.272 -> 0.247).
What it costs: a process keeps up to 256 MiB it no longer uses, never more than
it had in use at its peak (the memory is what the last call freed). Nothing is
set where the C library is not glibc, where the user configured glibc's
``malloc`` (``MALLOC_*_`` variables, ``GLIBC_TUNABLES`` naming
``glibc.malloc``), or with ``TSBATCH_KEEP_HEAP=0``.
"""

from __future__ import annotations

import os

__all__ = ["keep_freed_heap", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

#: glibc's ceiling for its dynamic mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)
MMAP_THRESHOLD = 32 << 20
#: free heap top kept between calls: a 100k-row evaluation's temporaries (module doc;
#: glibc's dynamic rule would stop at twice the mmap threshold, 64 MiB)
TRIM_THRESHOLD = 256 << 20

_M_TRIM_THRESHOLD = -1  # mallopt parameters, <malloc.h>
_M_MMAP_THRESHOLD = -3

_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_MMAP_MAX_")

def _wanted() -> bool:
    if os.environ.get("TSBATCH_KEEP_HEAP", "1") == "0":
        return False
    if any(v in os.environ for v in _USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


_state: bool | None = None  # None: not decided in this process yet


def keep_freed_heap() -> bool:
    """Set glibc's trim and mmap thresholds (module doc), the first time in the
    process; whether tsbatch set them."""
    global _state
    if _state is None:
        _state = _wanted() and _set()
    return _state


def _set() -> bool:
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        # setting either threshold ends glibc's dynamic rule: both are set
        return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False
