"""The one place that holds numba flags for every kernel (STYLE.md, "Kernels").

``fastmath`` allows contraction and reassociation but keeps NaN/inf
semantics: an infinite reuse distance (a cold miss) and a NaN latency (an
infeasible row) carry meaning. ``cache=True`` stores compiled machine code
next to the package (or in ``NUMBA_CACHE_DIR``), so a process start does not
recompile; a cached kernel loads without numba's compiler set-up
(``_fastload``).
"""

from __future__ import annotations

import os

# GNU OpenMP's default busy-wait makes every parallel region cost ~8 ms on a
# small machine; numba reads this when its threading layer first starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tsbatch.kernels._fastload import cached_jit  # noqa: E402  (njit(cache=True, ...), tsbatch's cache)

FASTMATH = {"contract", "arcp", "reassoc", "nsz", "afn"}

#: decorator for scalar device-style helpers, inlined into callers
jit_scalar = cached_jit(fastmath=FASTMATH, inline="always", nogil=True)
#: the same helpers left as calls (numba's IR inlining copies a helper into
#: every call site; a large one called from four places compiled 3-4x slower)
jit_scalar_call = cached_jit(fastmath=FASTMATH, nogil=True)
#: decorator for serial array kernels
jit_serial = cached_jit(fastmath=FASTMATH, nogil=True)
#: decorator for serial array kernels that allocate nothing and keep no
#: reference to their arrays: compiled without numba's runtime, so passing
#: and using an array costs no reference counting (an atomic increment and
#: decrement per array per call otherwise, which control flow keeps numba
#: from pruning); they may only be called from jitted code that owns the arrays
jit_borrow = cached_jit(fastmath=FASTMATH, nogil=True, _nrt=False)
#: decorator for serial kernels whose arithmetic must match numpy's to the bit
#: (lowering: plain IEEE operations in source order, no contraction)
jit_exact = cached_jit(nogil=True)
#: the same, inlined into callers (the simulator's small helpers)
jit_exact_inline = cached_jit(nogil=True, inline="always")
#: decorator for row-parallel array kernels (``prange`` over rows)
jit_parallel = cached_jit(fastmath=FASTMATH, nogil=True, parallel=True)
#: the same two for kernels that only jitted code calls, never Python (each
#: also :func:`tsbatch.kernels._extern.separately_linked`): no CPython or C
#: wrapper is compiled for them (a wrapper unboxes every array of a record
#: argument: a third of such a kernel's compile and cached code)
_INTERNAL = dict(no_cpython_wrapper=True, no_cfunc_wrapper=True)
jit_serial_internal = cached_jit(fastmath=FASTMATH, nogil=True, **_INTERNAL)
jit_borrow_internal = cached_jit(fastmath=FASTMATH, nogil=True, _nrt=False, **_INTERNAL)
