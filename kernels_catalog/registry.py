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

import threading
from collections.abc import Iterator, Mapping

from kernels_catalog import gemm as gemm_family
from kernels_catalog.base import Family
from tsbatch.errors import InputError

__all__ = ["FAMILIES", "get_family", "detect_family", "no_family_message", "TILE_COLUMNS"]


def _register_optional(into: dict) -> None:
    """Families whose modules may be absent from a partial checkout."""
    try:
        from kernels_catalog.collectives import FAMILY as collective  # noqa: PLC0415
        from kernels_catalog.fused_comm import FAMILIES as fused  # noqa: PLC0415
    except ImportError:
        return
    into.setdefault(collective.name, collective)
    for fam in (fused.values() if isinstance(fused, dict) else fused):
        into.setdefault(fam.name, fam)


class _Families(Mapping):
    """Every family by name, in detection order: GEMM, the catalog's tile
    programs, the collectives, the fused families. GEMM is there at import;
    the others are loaded on the first look-up of another name, iteration or
    count (reading and checking the catalog's program files took ~30 ms of
    every process start, also of the many that evaluate GEMM only)."""

    def __init__(self, first: dict[str, Family]):
        self._first = dict(first)
        self._all: dict[str, Family] | None = None
        self._lock = threading.Lock()

    def _every(self) -> dict[str, Family]:
        if self._all is None:
            with self._lock:
                if self._all is None:
                    from kernels_catalog.catalog import program_families  # noqa: PLC0415

                    every = dict(self._first)
                    for name, fam in program_families().items():
                        every.setdefault(name, fam)
                    _register_optional(every)
                    self._all = every
        return self._all

    def __getitem__(self, name: str) -> Family:
        fam = self._first.get(name) if isinstance(name, str) else None
        return fam if fam is not None else self._every()[name]

    def __contains__(self, name) -> bool:
        return (isinstance(name, str) and name in self._first) or name in self._every()

    def __iter__(self) -> Iterator[str]:
        return iter(self._every())

    def __len__(self) -> int:
        return len(self._every())

    def __repr__(self) -> str:
        return f"FAMILIES({list(self)!r})"


FAMILIES: Mapping[str, Family] = _Families({"gemm": gemm_family.FAMILY})

#: schedule columns a table may leave to the family's defaults when detecting it
TILE_COLUMNS = ("block_m", "block_n", "block_k", "num_stages", "num_warps")


def get_family(name: "str | Family") -> Family:
    """A family by name, a :class:`Family` as it is, or the family of a tile
    program in a TOML file (a name ending in ``.toml``)."""
    if isinstance(name, Family):
        return name
    if str(name).endswith(".toml"):
        from kernels_catalog.catalog import family_from_file  # noqa: PLC0415

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

    def fits(fam: Family) -> bool:
        return all(c.name in names for c in fam.columns if c.required and c.name not in
                   TILE_COLUMNS)

    if fits(gemm_family.FAMILY):  # the first family tried (the others not loaded yet)
        return gemm_family.FAMILY.name
    for fam in FAMILIES.values():
        if fits(fam):
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
