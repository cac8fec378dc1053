"""The registry of kernel families: the one place that knows every family.

GEMM (:mod:`kernels_catalog.gemm`), the tile programs of
``kernels_catalog/programs/`` (:mod:`kernels_catalog.catalog`), the collectives
(:mod:`kernels_catalog.collectives`) and the fused compute-communication
families (:mod:`kernels_catalog.fused_comm`), by name, GEMM first (the order in
which :func:`detect_family` tries them). A user's tile program is a family too,
loaded from its file by :func:`get_family`.

The engine (:mod:`tsbatch.engine.evaluate`) and the front doors look families up here;
no family module imports the engine: a family that composes others (the fused
families run GEMM or attention chunks) is handed the engine's evaluator when
it is called (:attr:`kernels_catalog.base.Family.evaluate`).
"""

from __future__ import annotations

from kernels_catalog import gemm as gemm_family
from kernels_catalog.base import Family
from kernels_catalog.catalog import family_from_file, program_families
from tsbatch.errors import InputError

__all__ = ["FAMILIES", "get_family", "detect_family", "no_family_message", "TILE_COLUMNS"]

FAMILIES: dict[str, Family] = {"gemm": gemm_family.FAMILY, **program_families()}


def _register_optional() -> None:
    """Families whose modules may be absent from a partial checkout."""
    try:
        from kernels_catalog.collectives import FAMILY as collective  # noqa: PLC0415
        from kernels_catalog.fused_comm import FAMILIES as fused  # noqa: PLC0415
    except ImportError:
        return
    FAMILIES.setdefault(collective.name, collective)
    for fam in (fused.values() if isinstance(fused, dict) else fused):
        FAMILIES.setdefault(fam.name, fam)


_register_optional()

#: schedule columns a table may leave to the family's defaults when detecting it
TILE_COLUMNS = ("block_m", "block_n", "block_k", "num_stages", "num_warps")


def get_family(name: "str | Family") -> Family:
    """A family by name, a :class:`Family` as it is, or the family of a tile
    program in a TOML file (a name ending in ``.toml``)."""
    if isinstance(name, Family):
        return name
    if str(name).endswith(".toml"):
        return family_from_file(name)
    try:
        return FAMILIES[name]
    except KeyError:
        raise InputError(f"unknown kernel family '{name}'; known: {', '.join(FAMILIES)} "
                         f"(or a tile program FILE.toml)") from None


def detect_family(columns) -> str:
    """The family whose required columns a candidate table has (GEMM first).

    When none has them all, the error names the family the columns come
    closest to (fewest required columns absent, then most present) and the
    columns it lacks, so that a file missing ``k`` says so."""
    names = set(columns)
    for fam in FAMILIES.values():
        if all(c.name in names for c in fam.columns if c.required and c.name not in
               TILE_COLUMNS):
            return fam.name
    raise InputError(no_family_message(names))


def no_family_message(names) -> str:
    """Why no family matches the columns ``names``: the closest family and what it lacks."""
    names = set(names)
    best = None
    for i, fam in enumerate(FAMILIES.values()):
        need = [c.name for c in fam.columns if c.required]
        missing = [c for c in need if c not in names]
        present = len(need) - len(missing)
        if present and (best is None or (len(missing), -present, i) < best[0]):
            best = ((len(missing), -present, i), fam, need, missing)
    head = f"no kernel family matches the columns {sorted(names)}"
    if best is None:
        return (f"{head}; known: {', '.join(FAMILIES)} (tsbatch families lists their "
                f"columns)")
    _, fam, need, missing = best
    s = "s" if len(missing) > 1 else ""
    return (f"{head}: closest is {fam.name}, which lacks column{s} "
            f"{', '.join(repr(m) for m in missing)} ({fam.name} candidates need: "
            f"{', '.join(need)}; other families: tsbatch families)")
