"""The catalog's tile-program families (``kernels_catalog/programs/*.toml``)
and user programs loaded from a TOML file."""

from __future__ import annotations

import functools
from pathlib import Path

from kernels_catalog.base import Family
from kernels_catalog.lowering import family_from_program
from kernels_catalog.program import load_program

__all__ = ["PROGRAM_DIR", "program_families", "family_from_file"]

PROGRAM_DIR = Path(__file__).parent / "programs"

#: catalog programs that define a family of their own (GEMM's program describes
#: the GEMM family, whose lowering is kernels_catalog/gemm.py)
_OWN_LOWERING = {"gemm"}


@functools.lru_cache(maxsize=None)
def _catalog() -> tuple[Family, ...]:
    out = []
    for path in sorted(PROGRAM_DIR.glob("*.toml")):
        prog = load_program(path)
        if prog.name not in _OWN_LOWERING:
            out.append(family_from_program(prog))
    return tuple(out)


def program_families() -> dict[str, Family]:
    """Every catalog family defined by a tile program alone, by name."""
    return {f.name: f for f in _catalog()}


def family_from_file(path: str | Path) -> Family:
    """A user's fused kernel: the family of the tile program in ``path``."""
    return family_from_program(load_program(path))
