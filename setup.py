"""Build hook: a wheel of tsbatch carries its compiled numba kernels.

Everything about the package is in pyproject.toml; this file only adds one
step to ``build_py``. After the modules are copied into the build tree, it runs
``python -m tsbatch._precompile`` there with ``TSBATCH_PRECOMPILE=1``, which
compiles the kernels for the signatures that ``explain``, ``sweep``,
``prune()`` and the other first calls use and writes the code to ``_nbcache/``
beside each kernel module, so the wheel ships it and a new install's first
call loads instead of compiling (tsbatch/kernels/_fastload.py says when
shipped code is used and when it falls back to compiling).

``TSBATCH_BUILD_PRECOMPILE=0`` skips the step (a wheel without compiled code,
which compiles on first use). An editable install skips it too: its kernels
compile into ``__pycache__`` on first use, as numba does. A failing step never
fails the build; it is reported and the wheel is built without that code.

A wheel that carries compiled code is tagged for what built it: the
interpreter and its ABI (the code calls CPython's C API of that version) and
the platform, e.g. ``tsbatch-0.1.0-cp311-cp311-linux_x86_64.whl``; without
compiled code it stays ``py3-none-any``. The code is compiled for the build
machine's CPU, which no wheel tag can name: on another CPU (or numba, or
source) it is not used and the kernels compile on first use
(tsbatch/kernels/_fastload.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_precompiled(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False) or \
                os.environ.get("TSBATCH_BUILD_PRECOMPILE", "1") == "0":
            return
        lib = Path(self.build_lib).resolve()
        for old in lib.glob("tsbatch/**/_nbcache"):
            shutil.rmtree(old)  # code of an earlier build of other sources
        env = dict(os.environ, TSBATCH_PRECOMPILE="1", TQDM_DISABLE="1")
        env.pop("NUMBA_CACHE_DIR", None)
        # keep the build environment's own path entries (pip's isolated build env)
        env["PYTHONPATH"] = os.pathsep.join([str(lib)] + [p for p in [env.get("PYTHONPATH")] if p])
        print("tsbatch: compiling the numba kernels for the wheel (a minute or more; "
              "TSBATCH_BUILD_PRECOMPILE=0 skips)", flush=True)
        res = subprocess.run([sys.executable, "-m", "tsbatch._precompile"], cwd=lib, env=env)
        if res.returncode != 0:
            print("tsbatch: precompiling failed; the wheel's kernels compile on first use",
                  flush=True)


def ships_code(build_lib) -> bool:
    """Whether the build tree holds compiled kernels (``_nbcache/`` index files)."""
    return any(Path(build_lib).glob("tsbatch/**/_nbcache/*.nbi"))


CMDCLASS = {"build_py": build_py_precompiled}

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheels built here
        bdist_wheel = None

if bdist_wheel is not None:
    class bdist_wheel_shipped(bdist_wheel):
        """A wheel with compiled code is not pure: tag it cpXY-cpXY-PLATFORM."""

        def run(self):
            if not self.skip_build:
                self.run_command("build")  # run once: bdist_wheel's own call is then a no-op
            if ships_code(self.get_finalized_command("build_py").build_lib):
                # tagged by interpreter and platform, its modules at the wheel's root
                # (platlib) as a wheel with extension modules has them
                self.root_is_pure = False
                self.distribution.has_ext_modules = lambda: True
            super().run()

    CMDCLASS["bdist_wheel"] = bdist_wheel_shipped


if __name__ == "__main__":  # setuptools runs this file as __main__
    setup(cmdclass=CMDCLASS)
