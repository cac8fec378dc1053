"""Load cached kernels without numba's full compiler set-up.

Before it loads a cached overload, numba refreshes the target context
(``numba.core.caching.Cache.load_overload``): it imports and installs every
typing and lowering registry numba has (``numba.cpython.*``, ``numba.np.*``,
``numba.typed.*``, ...). Those registries are what the *compiler* needs; a
cached overload is finished machine code plus pickled type descriptions and
needs only the runtime (NRT, initialized here). On a warm ``tsbatch
evaluate`` the refresh is a third of a second or more, about as long as
importing numba itself.

:func:`install` gives a dispatcher a cache that initializes the runtime and
loads the overload directly. Nothing else changes: the same files are read
(caching stays on, same index and data), a miss still compiles, and
compiling still refreshes the context first (``CompilerBase.__init__``), as
does any failure while loading, which retries with numba's own path. Only
tsbatch's own dispatchers are affected, never a user's.
"""

from __future__ import annotations

import os

from numba.core.caching import FunctionCache

__all__ = ["install"]

#: ``TSBATCH_NUMBA_FASTLOAD=0`` keeps numba's own loading (for comparison)
ENABLED = os.environ.get("TSBATCH_NUMBA_FASTLOAD", "1") != "0"


class _FastLoadCache(FunctionCache):
    """A :class:`FunctionCache` whose loading skips the registry refresh."""

    def load_overload(self, sig, target_context):
        try:
            from numba.core.runtime import rtsys

            rtsys.initialize(target_context)  # what the loaded code needs at run time
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:
            # anything unexpected: numba's own path (refresh, then load)
            return super().load_overload(sig, target_context)


def install(dispatcher):
    """Give ``dispatcher`` (``njit(cache=True)``) the fast-loading cache; returns it."""
    if ENABLED and type(getattr(dispatcher, "_cache", None)) is FunctionCache:
        dispatcher._cache.__class__ = _FastLoadCache
    return dispatcher


def fast_loading(decorator):
    """Wrap an ``njit(...)`` decorator so that its dispatchers load fast."""

    def wrap(fn):
        return install(decorator(fn))

    wrap.__doc__ = getattr(decorator, "__doc__", None)
    return wrap
