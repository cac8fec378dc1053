"""Tile launch orders: the sequence in which a 3-D tile grid is issued.

A launch order maps a linear program id to tile coordinates ``(x0, x1, x2)``
on a grid ``g0 x g1 x g2``. Dimension 2 (a split of the reduction, or a
batch) is always slowest, as ``blockIdx.z`` is on the hardware; the codes
choose the order of the 2-D plane:

``ORDER_ROW``        raster along dim 1 (``x1`` fastest; row panels)
``ORDER_COL``        raster along dim 0 (``x0`` fastest)
``ORDER_GROUPED``    Triton/Inductor super-grouping: panels of ``group``
                     rows, column-major inside a panel
``ORDER_ZORDER``     Morton (Z) order over the plane
``ORDER_PERSISTENT`` persistent programs walking the grouped order with a
                     stride of the number of programs: the same issue
                     sequence as ``ORDER_GROUPED`` (waves are the strides)

TileSight §3.5.3: "a block swizzle, row-panel, Z-order, or persistent-block
schedule is just a concrete sequence of tile coordinates fed to the
reuse-distance simulation".
"""

from __future__ import annotations

import numpy as np

from tsbatch.kernels._config import jit_scalar, jit_serial
from tsbatch.kernels._extern import separately_linked

__all__ = [
    "ORDER_ROW",
    "ORDER_COL",
    "ORDER_GROUPED",
    "ORDER_ZORDER",
    "ORDER_PERSISTENT",
    "ORDER_NAMES",
    "tile_coords",
    "launch_order",
]

ORDER_ROW = 0
ORDER_COL = 1
ORDER_GROUPED = 2
ORDER_ZORDER = 3
ORDER_PERSISTENT = 4
ORDER_NAMES = {
    "row": ORDER_ROW,
    "col": ORDER_COL,
    "grouped": ORDER_GROUPED,
    "zorder": ORDER_ZORDER,
    "persistent": ORDER_PERSISTENT,
}


@jit_scalar
def _morton_decode(code, nbits0, nbits1):
    """Split a Morton code: bits interleave while both dims have bits left,
    then the longer dimension's remaining bits are most significant."""
    x0 = 0
    x1 = 0
    b0 = 0
    b1 = 0
    bit = 0
    while b0 < nbits0 or b1 < nbits1:
        if b1 < nbits1:
            x1 |= ((code >> bit) & 1) << b1
            b1 += 1
            bit += 1
        if b0 < nbits0:
            x0 |= ((code >> bit) & 1) << b0
            b0 += 1
            bit += 1
    return x0, x1


@jit_scalar
def _nbits(n):
    b = 0
    while (1 << b) < n:
        b += 1
    return b


@jit_scalar
def tile_coords(order, g0, g1, g2, group, pid):
    """Coordinates of program ``pid`` for the non-Morton orders (O(1))."""
    plane = g0 * g1
    x2 = pid // plane
    r = pid - x2 * plane
    if order == ORDER_ROW:
        return r // g1, r - (r // g1) * g1, x2
    if order == ORDER_COL:
        return r - (r // g0) * g0, r // g0, x2
    # grouped / persistent
    gm = group if group > 0 else 1
    width = gm * g1
    gid = r // width
    first = gid * gm
    size = g0 - first
    if size > gm:
        size = gm
    inner = r - gid * width
    return first + inner % size, inner // size, x2


@separately_linked
@jit_serial
def launch_order(order, g0, g1, g2, group, x0, x1, x2):
    """Fill ``x0, x1, x2`` (length ``g0*g1*g2``) with the issue sequence."""
    n = g0 * g1 * g2
    if order != ORDER_ZORDER:
        for pid in range(n):
            a, b, c = tile_coords(order, g0, g1, g2, group, pid)
            x0[pid] = a
            x1[pid] = b
            x2[pid] = c
        return
    nb0 = _nbits(g0)
    nb1 = _nbits(g1)
    total = 1 << (nb0 + nb1)
    pid = 0
    for z in range(g2):
        for code in range(total):
            a, b = _morton_decode(code, nb0, nb1)
            if a < g0 and b < g1:
                x0[pid] = a
                x1[pid] = b
                x2[pid] = z
                pid += 1


def launch_order_array(order: int, g0: int, g1: int, g2: int, group: int):
    """Convenience wrapper returning three int64 arrays."""
    n = g0 * g1 * g2
    x0 = np.empty(n, dtype=np.int64)
    x1 = np.empty(n, dtype=np.int64)
    x2 = np.empty(n, dtype=np.int64)
    launch_order(order, g0, g1, g2, group, x0, x1, x2)
    return x0, x1, x2
