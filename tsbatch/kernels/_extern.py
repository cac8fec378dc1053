"""Kernels their callers call without taking in their code (a cold start's compile time).

When jitted code calls another numba function, numba links the callee's
optimized LLVM module into the caller's and optimizes and compiles the whole
again (``CPUCodeLibrary.finalize``): a kernel four calls deep in the cache
model (``_cache_rows`` -> ``_cache_one`` -> ``_hits_blocks`` -> ``_group_l15``
-> ``_memo_hits``) is optimized and compiled to machine code five times on a
cold start. For a large kernel that a caller calls once per wave or per
problem, that buys nothing at run time: LLVM does not inline it anyway.

:func:`separately_linked` marks such a kernel: a call to it from jitted code
is a call of its machine code by address (a function symbol of its own,
``tsbatch.extern$<numba's mangled name>``, given to LLVM's dynamic linker with
``llvmlite.binding.add_symbol`` as soon as the kernel is compiled or loaded),
so callers never link or re-optimize its code. The call itself is numba's
ordinary native calling convention (status, return slot, arguments), the same
instructions as a call numba links and LLVM does not inline.

A caller's compiled code is cached (``cache=True``) with a reference to that
symbol; numba loads a cached function's ``reload_init`` callables before its
machine code (``CompileResult._rebuild``), so each caller carries a
:class:`_Load` of every such callee: it imports the callee's module and
compiles (in practice: loads from the cache) the callee's signature, which
defines the symbol before the caller's object code is linked.
"""

from __future__ import annotations

import importlib

import llvmlite.binding as ll
from numba.core import cgutils
from numba.core.imputils import fix_returning_optional, impl_ret_new_ref

__all__ = ["separately_linked", "supported", "PREFIX"]

#: prefix of the symbol a separately linked kernel's machine code is given
PREFIX = "tsbatch.extern$"
_defined: dict[str, int] = {}


def _define(cres) -> str:
    """Give LLVM's dynamic linker the symbol of ``cres``'s machine code."""
    name = PREFIX + cres.fndesc.mangled_name
    addr = cres.library.get_pointer_to_function(cres.fndesc.mangled_name)
    if not addr:
        raise RuntimeError(f"{cres.fndesc.mangled_name}: no machine code to call")
    if _defined.get(name) != addr:
        ll.add_symbol(name, addr)
        _defined[name] = addr
    return name


class _Load:
    """Picklable ``reload_init`` entry of a caller: load (or compile) the callee
    ``module.qualname`` for ``args`` so that its symbol is defined first."""

    __slots__ = ("module", "qualname", "args")

    def __init__(self, module: str, qualname: str, args: tuple):
        self.module, self.qualname, self.args = module, qualname, tuple(args)

    def __call__(self) -> None:
        disp = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            disp = getattr(disp, part)
        disp.compile(self.args)  # its add_overload defines the symbol

    def __reduce__(self):
        return (_Load, (self.module, self.qualname, self.args))

    def __eq__(self, other):
        return isinstance(other, _Load) and (self.module, self.qualname, self.args) == (
            other.module, other.qualname, other.args)

    def __hash__(self):
        return hash((self.module, self.qualname, self.args))


def _call_impl(fndesc, load: _Load):
    """numba's ``user_function`` (imputils), calling the symbol instead of linking."""
    name = PREFIX + fndesc.mangled_name

    def imp(context, builder, sig, args):
        fnty = context.call_conv.get_function_type(fndesc.restype, fndesc.argtypes)
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        # the caller's cached code is loaded only after the callee's
        context.active_code_library._reload_init.add(load)
        status, retval = context.call_conv.call_function(builder, fn, fndesc.restype,
                                                         fndesc.argtypes, args)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        assert sig.return_type == fndesc.restype
        retval = fix_returning_optional(context, builder, sig, status, retval)
        return impl_ret_new_ref(context, builder, fndesc.restype, retval)

    imp.signature = fndesc.argtypes
    imp.libs = ()
    return imp


_SUPPORTED: bool | None = None


def supported(ctx) -> bool:
    """Whether this numba has the internals the mechanism uses (the target
    context's table of implementations, a code library's ``reload_init`` set);
    checked once. Without them kernels are linked the ordinary way: slower to
    compile, the same results."""
    global _SUPPORTED
    if _SUPPORTED is None:
        try:
            lib = ctx.codegen().create_library("tsbatch.extern.probe")
            _SUPPORTED = (isinstance(getattr(lib, "_reload_init", None), set)
                          and hasattr(ctx, "_defns") and hasattr(ll, "add_symbol"))
        except Exception:  # noqa: BLE001 - any failure means: link the ordinary way
            _SUPPORTED = False
    return _SUPPORTED


def separately_linked(dispatcher):
    """Make jitted callers of ``dispatcher`` (an ``njit`` function at module level)
    call its machine code instead of linking its code; returns it (anything that
    is not a numba dispatcher, e.g. under ``NUMBA_DISABLE_JIT=1``, or a numba
    without the internals used, unchanged)."""
    f = getattr(dispatcher, "py_func", None)
    if f is None or not hasattr(dispatcher, "add_overload") or not supported(dispatcher.targetctx):
        return dispatcher
    module, qualname = f.__module__, f.__qualname__
    add = dispatcher.add_overload
    # compiled without a CPython wrapper (``no_cpython_wrapper``): jitted code only
    internal = bool(dispatcher.targetoptions.get("no_cpython_wrapper"))

    def add_overload(cres):
        if internal:
            # what numba's add_overload does, less the entry in the dispatcher's
            # table of Python calls (its entry point has no wrapper to call)
            dispatcher.overloads[tuple(cres.signature.args)] = cres
        else:
            add(cres)
        if cres.objectmode:
            return
        _define(cres)
        ctx = dispatcher.targetctx
        ctx._defns.pop(cres.entry_point, None)  # numba's linking implementation
        impl = _call_impl(cres.fndesc, _Load(module, qualname, tuple(cres.signature.args)))
        ctx._defns[cres.entry_point].append(impl, impl.signature)

    dispatcher.add_overload = add_overload
    if internal:
        def python_call(*args, **kws):
            raise TypeError(f"{module}.{qualname} is called from jitted code only "
                            "(compiled without a Python wrapper)")

        dispatcher._compile_for_args = python_call
    return dispatcher
