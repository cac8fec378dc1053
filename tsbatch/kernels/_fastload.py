"""How tsbatch's kernels find their compiled code: fast loading, and code that ships.

Two things change from numba's own ``cache=True``, for tsbatch's dispatchers
only (never a user's):

*Fast loading.* Before it loads a cached overload, numba refreshes the target
context (``numba.core.caching.Cache.load_overload``): it imports and installs
every typing and lowering registry numba has (``numba.cpython.*``,
``numba.np.*``, ``numba.typed.*``, ...). Those registries are what the
*compiler* needs; a cached overload is finished machine code plus pickled type
descriptions and needs only the runtime (NRT, initialized here). On a warm
``tsbatch evaluate`` the refresh is a third of a second or more, about as long
as importing numba itself. ``TSBATCH_NUMBA_FASTLOAD=0`` keeps numba's refresh.

*Shipped code.* A wheel built from this tree carries compiled kernels: the
build (``setup.py``) runs :mod:`tsbatch._precompile` with
``TSBATCH_PRECOMPILE=1``, which makes every overload compiled in that process
be written to ``_nbcache/`` beside its module instead of the usual cache. At
run time, when the usual cache (``__pycache__`` or ``NUMBA_CACHE_DIR``) has no
entry for a signature, the loader looks in ``_nbcache/``. The entry is numba's
own index and data format, keyed as numba keys it: numba's version, a hash of
the module's source, the function's bytecode, the signature and the CPU name
and features. So shipped code loads only on a machine and install that match
what built it; anywhere else the lookup misses and the kernel compiles as it
always did (and is then stored in the usual cache). ``TSBATCH_PRECOMPILED=0``
ignores the shipped code (for measuring a cold start).

*Machine code now, module for linking on demand.* A cached overload holds
the kernel's machine code and, for jitted callers that link it, its optimized
LLVM module as bitcode; numba parses that bitcode on every load and walks its
functions to learn which symbols the machine code defines. In a warm process
nothing is compiled, so nothing links it; and callers never link a kernel that
:func:`tsbatch.kernels._extern.separately_linked` marks (they call its
symbol). So a tsbatch kernel loads its machine code alone
(:func:`_without_linking_module`): numba is handed the bitcode of an empty
module, the symbols the load looks up (the kernel's own and, where it has them,
its Python and C wrappers') are named from the function descriptor instead,
and the kernel's own bitcode is parsed only if a caller compiled later in the
process links it (:func:`_link_on_demand`). Same machine code; ~1-5 ms less
per load, 18 loads in a warm 1,000-row ``evaluate``.

*Environments without numba's modules.* A cached kernel carries the
environment of every function whose code it holds, numba's own
implementations included (``np.full``'s in ``numba.np.arrayobj``); numba
rebuilds each by importing the function's module, whose namespace the
environment keeps as its globals. Only object-mode code reads them, and
numba's implementation modules hold nopython code only, so where such a module
(``numba.*``) is not imported yet the environment gets a namespace holding its
name alone (:func:`_rebuilt_env`) instead of an import of the module and of
numba's typing and lowering registrations it brings (``numba.np.arrayobj``:
~20 ms of every warm start). A module imported already is used as numba would.

*numba's runtime from the cache too.* Loaded code needs numba's runtime (NRT),
whose few LLVM functions (reference counting, atomic operations) numba
compiles in every process when the runtime starts (~15 ms). The first load
of a process starts it with that library's machine code taken from a file
beside the kernels' cache (:func:`_initialize_runtime`), keyed like a cached
kernel (numba's and llvmlite's versions, the CPU name and features, the
runtime's debug settings), and writes the file when it compiles the library.

Compiling still refreshes the context first (``CompilerBase.__init__``), as
does any failure while loading, which retries with numba's own path.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import sys

from numba import njit
from numba.core import environment as _environment
from numba.core.caching import (CompileResultCacheImpl, FunctionCache, IndexDataCacheFile, NullCache,
                                 _cache_log)

__all__ = ["install", "fast_loading", "cached_jit", "SHIPPED_DIR"]

#: ``TSBATCH_NUMBA_FASTLOAD=0`` keeps numba's own loading (for comparison)
ENABLED = os.environ.get("TSBATCH_NUMBA_FASTLOAD", "1") != "0"
#: ``TSBATCH_PRECOMPILED=0`` ignores the compiled code a wheel ships
USE_SHIPPED = os.environ.get("TSBATCH_PRECOMPILED", "1") != "0"
#: set by the wheel build: overloads compiled now are written to the shipped cache
PRECOMPILING = os.environ.get("TSBATCH_PRECOMPILE", "0") == "1"
#: the directory, beside each kernel module, that holds shipped compiled code
SHIPPED_DIR = "_nbcache"


class _TsbatchCache(FunctionCache):
    """A :class:`FunctionCache` that loads fast and falls back to shipped code."""

    _shipped = None  # IndexDataCacheFile of the shipped cache, or None
    _wrappers = True  # whether the kernel has Python and C wrappers (install)

    def load_overload(self, sig, target_context):
        try:
            if ENABLED:
                _initialize_runtime(target_context, self._cache_path)  # what loaded code needs
            else:
                target_context.refresh()
            with self._guard_against_spurious_io_errors():
                if not self._enabled:
                    return None
                codegen = target_context.codegen()
                key = self._index_key(sig, codegen)
                found = self._cache_file.load(key)
                if found is None and self._shipped is not None:
                    found = self._shipped.load(key)
                if found is None:
                    return None
                if not ENABLED:
                    return self._impl.rebuild(target_context, found)
                found, bitcode = _without_linking_module(found, codegen, self._wrappers)
                cres = self._impl.rebuild(target_context, found)
                if bitcode is not None:
                    _link_on_demand(cres.library, bitcode)
                return cres
        except Exception:
            # anything unexpected: numba's own path (refresh, then load)
            return super().load_overload(sig, target_context)


def _initialize_runtime(ctx, cache_dir: str) -> None:
    """``rtsys.initialize(ctx)`` (numba's runtime), its library of LLVM functions
    loaded from ``cache_dir`` when compiled there before, else compiled and stored."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.runtime import nrtdynmod, rtsys

    if rtsys._init:
        return
    with global_compiler_lock:
        if rtsys._init:
            return
        compile_nrt = nrtdynmod.compile_nrt_functions
        nrtdynmod.compile_nrt_functions = lambda c: _nrt_library(c, cache_dir, compile_nrt)
        try:
            rtsys.initialize(ctx)
        finally:
            nrtdynmod.compile_nrt_functions = compile_nrt


#: the functions numba's runtime looks up in its library
_NRT_FUNCTIONS = ("nrt_atomic_add", "nrt_atomic_sub", "nrt_atomic_cas", "NRT_MemInfo_data_fast",
                  "NRT_incref", "NRT_decref", "nrt_unresolved_abort")


def _nrt_library(ctx, cache_dir: str, compile_nrt):
    """numba's ``compile_nrt_functions(ctx)``, through a file in ``cache_dir``."""
    import hashlib

    import llvmlite
    import numba
    from numba.core import config
    from numba.core.runtime import nrtdynmod

    codegen = ctx.codegen()
    try:
        key = repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple(),
                    config.DEBUG_NRT, config.DEBUG_NRT_STACK_LIMIT, config.OPT, config.MACHINE_BITS))
        path = os.path.join(cache_dir, "tsbatch-nrt-%s.nbo" % hashlib.sha256(key.encode()).hexdigest()[:24])
    except Exception:  # noqa: BLE001 - numba's own way
        return compile_nrt(ctx)
    try:
        with open(path, "rb") as f:
            stored_key, libdata = pickle.load(f)
        if stored_key == key:
            library = codegen.unserialize_library(libdata)
            if all(library.get_pointer_to_function(n) for n in _NRT_FUNCTIONS):
                return library
    except Exception:  # noqa: BLE001 - no file, another version's, unreadable: compile
        pass
    try:
        ir_mod, library = nrtdynmod.create_nrt_module(ctx)  # compile_nrt_functions, keeping
        library.enable_object_caching()  # the machine code to store
        library.add_ir_module(ir_mod)
        library.finalize()
        data = pickle.dumps((key, library.serialize_using_object_code()), protocol=-1)
    except Exception:  # noqa: BLE001
        return compile_nrt(ctx)
    try:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass
    return library


_EMPTY_BITCODE: dict[int, bytes] = {}


def _without_linking_module(payload, codegen, wrappers: bool):
    """``(payload, bitcode)``: ``payload`` (a cached ``CompileResult``) with the
    bitcode of an empty module in place of the kernel's module for linking (that
    bitcode returned beside it), the symbols numba looks up in the machine code
    declared to its JIT engine instead; ``(payload, None)`` unchanged where it
    is not numba's object-code form."""
    libdata, fndesc = payload[0], payload[1]
    name, kind, data = libdata
    engine = getattr(codegen, "_engine", None)
    symbols = getattr(engine, "_defined_symbols", None)
    if kind != "object" or not isinstance(symbols, set):
        return payload, None
    empty = _EMPTY_BITCODE.get(id(codegen))
    if empty is None:
        import llvmlite.binding as ll

        empty = ll.parse_assembly(str(codegen._create_empty_module("tsbatch.code_only"))).as_bitcode()
        _EMPTY_BITCODE[id(codegen)] = empty
    names = {fndesc.mangled_name}
    if wrappers:
        names |= {fndesc.llvm_cpython_wrapper_name, fndesc.llvm_cfunc_wrapper_name}
    symbols |= names  # what numba's load learns from the module's functions
    return ((name, kind, (data[0], empty)),) + tuple(payload[1:]), data[1]


def _link_on_demand(library, bitcode: bytes) -> None:
    """Give a library loaded by :func:`_without_linking_module` its module for
    linking (numba's ``_get_module_for_linking``) parsed from ``bitcode`` when
    a caller first links it, as numba's load would have parsed it."""

    def module_for_linking():
        import llvmlite.binding as ll

        mod = ll.parse_bitcode(bitcode)
        library._shared_module = mod
        library._codegen._engine._load_defined_symbols(mod)
        del library._get_module_for_linking  # numba's method from now on: returns mod
        return mod

    library._get_module_for_linking = module_for_linking


def _rebuilt_env(modname, consts, env_name):
    """numba's ``_rebuild_env`` (a cached environment), without importing a module
    of numba's own that is not imported yet: its globals are read by object-mode
    code only, which numba's implementations are not."""
    if not (isinstance(modname, str) and modname.startswith("numba.")) or modname in sys.modules:
        return _environment._rebuild_env(modname, consts, env_name)
    env = _environment.lookup_environment(env_name)
    if env is None:
        env = _environment.Environment({"__name__": modname})
        env.consts[:] = consts
        env.env_name = env_name
        _environment.Environment._memo[env_name] = env
    return env


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "numba.core.environment" and name == "_rebuild_env":
            return _rebuilt_env
        return super().find_class(module, name)


class _TsbatchCacheFile(IndexDataCacheFile):
    """numba's index and data files, read with :func:`_rebuilt_env` for environments."""

    def _load_data(self, name):
        path = self._data_path(name)
        with open(path, "rb") as f:
            data = f.read()
        found = _Unpickler(io.BytesIO(data)).load()
        _cache_log("[cache] data loaded from %r", path)  # numba's NUMBA_DEBUG_CACHE line
        return found


#: module directories known to hold (True) or lack (False) a shipped cache
_SHIPPED_DIRS: dict[str, bool] = {}


def _shipped_file(cache: FunctionCache, create: bool):
    """The shipped cache file of ``cache``'s function (None where there is none)."""
    try:
        where = os.path.join(os.path.dirname(inspect.getfile(cache._py_func)), SHIPPED_DIR)
        if create:
            os.makedirs(where, exist_ok=True)
        else:
            there = _SHIPPED_DIRS.get(where)
            if there is None:
                there = _SHIPPED_DIRS[where] = os.path.isdir(where)
            if not there:
                return None
        return _TsbatchCacheFile(cache_path=where, filename_base=cache._impl.filename_base,
                                 source_stamp=cache._impl.locator.get_source_stamp())
    except (OSError, TypeError):
        return None


#: cache directories found writable by numba's check in this process
_WRITABLE: set[str] = set()


def _checked_once(locator_class):
    """``locator_class`` (one of numba's cache locators) whose check that its cache
    directory exists and is writable (``ensure_cache_path``: a ``makedirs`` and a
    temporary file created and removed) runs once per directory and process instead
    of once per kernel, ~0.2 ms of each of the ~65 dispatchers a warm evaluate makes."""

    def ensure_cache_path(self):
        path = self.get_cache_path()
        if path not in _WRITABLE:
            locator_class.ensure_cache_path(self)  # raises where it is not writable
            _WRITABLE.add(path)

    return type(locator_class)(locator_class.__name__, (locator_class,),
                               {"ensure_cache_path": ensure_cache_path, "__module__": __name__,
                                "__qualname__": locator_class.__qualname__})


class _TsbatchCacheImpl(CompileResultCacheImpl):
    """numba's cache implementation for compile results, its locators checking a
    directory once (:func:`_checked_once`)."""

    _locator_classes = [_checked_once(c) for c in CompileResultCacheImpl._locator_classes]


_TsbatchCache._impl_class = _TsbatchCacheImpl


def _setup(cache, dispatcher) -> None:
    cache._wrappers = not dispatcher.targetoptions.get("no_cpython_wrapper")
    if ENABLED and type(cache._cache_file) is IndexDataCacheFile:
        cache._cache_file.__class__ = _TsbatchCacheFile
    if PRECOMPILING:
        shipped = _shipped_file(cache, create=True)
        if shipped is not None:
            cache._cache_file = shipped  # compiled code goes where the wheel takes it
    elif USE_SHIPPED:
        cache._shipped = _shipped_file(cache, create=False)


def install(dispatcher):
    """Give ``dispatcher`` (``njit(cache=True)``) tsbatch's cache; returns it."""
    cache = getattr(dispatcher, "_cache", None)
    if type(cache) is FunctionCache:
        cache.__class__ = _TsbatchCache
        _setup(cache, dispatcher)
    return dispatcher


def fast_loading(decorator):
    """Wrap an ``njit(...)`` decorator so that its dispatchers use tsbatch's cache."""

    def wrap(fn):
        return install(decorator(fn))

    wrap.__doc__ = getattr(decorator, "__doc__", None)
    return wrap


def cached_jit(**options):
    """``fast_loading(njit(cache=True, **options))``, with tsbatch's cache made
    directly (numba's ``enable_caching``, less a second cache object and
    :func:`_checked_once`'s locators)."""
    decorator = njit(**options)

    def wrap(fn):
        dispatcher = decorator(fn)
        if isinstance(getattr(dispatcher, "_cache", None), NullCache):
            dispatcher._cache = cache = _TsbatchCache(dispatcher.py_func)
            _setup(cache, dispatcher)
        return dispatcher

    return wrap
