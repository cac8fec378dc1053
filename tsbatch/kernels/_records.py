"""The records the cache model's kernels pass each other (:mod:`tsbatch.kernels.reuse`).

A cache problem's kernels share dozens of arrays and scalars; grouped by what
travels together, a kernel takes a few records and its own wave's scalars:

* :class:`Batch`: the columns of a batch of cache problems (one row each),
  its sampling and its outputs;
* :class:`Problem`: one cache problem, fixed for all its waves (the launch
  grid and order, the per-tensor accesses, the caches, the SDCM's sampling);
* :class:`Book`: what the waves book-keep for later waves, and the hit sums;
* :class:`Scratch`: a wave's scratch arrays (reused by every wave);
* :class:`Memo`: the per-problem memo tables (SDCM calls, cross-wave hits,
  L1.5 group patterns and layouts).

They are plain named tuples: numba passes one as its fields (each array as
its usual pointer, shape and strides), so a kernel called with records gets
the very arguments it got one by one, and a field read is free. The kernels
taking them are compiled without numba's runtime (``jit_borrow``), so
neither passing a record nor reading an array out of it counts references.
A batch is made once per call (``reuse.cache_hit_rates``), the other
records once per problem (``reuse._cache_one``), which owns their arrays. Fields marked *in/out* are written by the kernels; the others are
read only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Batch", "Book", "Memo", "Problem", "Scratch"]


class Problem(NamedTuple):
    """One cache problem (TileSight §3.5), fixed for all its waves."""

    # ---- the launch: grid, order, waves
    g0: int  #: grid rows
    g1: int  #: grid columns
    g2: int  #: grid planes
    order: int  #: launch order code (tsbatch.kernels.order)
    group: int  #: the order's group size
    gm: int  #: panel rows of a panel order (1 row order, ``g0`` column order, else ``group``)
    zorder: bool  #: the order is z-order (coordinates read off ``x``, no panels)
    x: np.ndarray  #: (3, P) int64: z-order tile coordinates (empty otherwise)
    P: int  #: programs (tiles)
    conc: int  #: programs resident at once (a wave)
    # ---- the tensors: per tensor ``t``, of which ``n_step`` are read every step
    T: int  #: tensors
    per_step: np.ndarray  #: (T,) int64: read every reduction step (1) or once per tile (0)
    kstr: np.ndarray  #: (T, 3) int64: key strides of the non-reuse dimensions (0: reuse)
    koff: np.ndarray  #: (T + 1,) int64: first block id of each per-step tensor
    tbytes: np.ndarray  #: (T,) float64: block bytes
    n_step: int  #: per-step tensors (accesses per tile and step)
    #: the L1.5 pattern pool's room per tile and step: ``n_step`` with the per-step
    #: tensors of zero bytes left out of the sequence (``reuse._live_tensors``)
    pool_step: int
    once_bytes: float  #: once-per-tile bytes of a tile
    # ---- the caches, in tile units (``unit``: mean per-step block bytes)
    unit: float
    B2: float  #: L2 capacity in units
    assoc2: float
    use15: bool  #: an L1.5 tier is modelled
    B15: float  #: L1.5 capacity in units
    assoc15: float
    nsm: int  #: SMs
    g15: int  #: SMs per L1.5 group
    ngroups: int  #: L1.5 groups (1 without the tier)
    # ---- the reduction loop and the SDCM's samples along it
    kf: float  #: reduction steps, as a float
    ks: int  #: sampled steps
    svals: np.ndarray  #: (ks,) float64: the sampled step indices
    # ---- paths
    fast: bool  #: the fast path (else the general, per-access one)
    gsig: bool  #: L1.5 groups keyed by the panel layout of their runs (fast, panel orders)
    #: the per-step tensor with a block per tile whose blocks are keyed by their
    #: tile's position in the wave (ids ``koff[t] + p``, ``p < conc``), -1: none
    pkey: int
    #: a pair of per-step tensors merged into one (``reuse._pair_tensors``): the
    #: kept one's position in a tile's step (-1: none), the partner's block bytes
    #: added to each of its distances, and its block ids ``[pair_lo, pair_hi)``
    pair_q: int
    pair_b: float
    pair_lo: int
    pair_hi: int


class Book(NamedTuple):
    """What the waves book-keep for later waves (all in/out), and the hit sums."""

    # ---- per block id
    lastwave: np.ndarray  #: int64: the last wave that touched the block (-1: none)
    fstamp: np.ndarray  #: int64: stamp of the block's first touch in a step
    bstamp: np.ndarray  #: int64: stamp of the block's last touch in a step
    tail_b: np.ndarray  #: float64: distinct bytes after its last touch in that wave's step
    # ---- per wave ``w`` (the cumulative ones at ``w + 1``)
    ustep: np.ndarray  #: float64: distinct bytes of a step of wave ``w``
    newcum: np.ndarray  #: float64: sum of the bytes new to each wave
    oncecum: np.ndarray  #: float64: sum of the once-per-tile bytes of each wave
    # ---- per tensor, over all analysed accesses
    acc: np.ndarray  #: float64: accesses
    hit15: np.ndarray  #: float64: L1.5 hits
    req2: np.ndarray  #: float64: L2 requests
    hit2: np.ndarray  #: float64: L2 hits


class Scratch(NamedTuple):
    """A wave's scratch arrays, all in/out, reused by every wave.

    ``L = conc * n_step`` accesses a step of a wave at most."""

    # ---- the step sequence (length L)
    ids: np.ndarray  #: int64: block id of access ``j``
    wts: np.ndarray  #: float64: its bytes
    ten: np.ndarray  #: int64: its tensor
    grp: np.ndarray  #: int64: its L1.5 group (general path); the first touches (fast)
    dist: np.ndarray  #: float64: within-step distance; L2 hits of the first touches
    head: np.ndarray  #: float64: bytes first touched in the step before it
    h15: np.ndarray  #: float64: its L1.5 hit probability
    # ---- step_distances and the L1.5 subsequences
    tree: np.ndarray  #: (L + 1,) float64: Fenwick tree, all zero between calls
    last_idx: np.ndarray  #: (ids,) int64: all -1 between calls
    sub_ids: np.ndarray  #: int64 (L)
    sub_wts: np.ndarray  #: float64 (L)
    sub_j: np.ndarray  #: int64 (L): access of a subsequence entry
    sub_d: np.ndarray  #: float64 (L): distances, then probabilities
    sub_lab: np.ndarray  #: int64 (L): first-touch labels
    goff: np.ndarray  #: (ngroups + 1,) int64: group offsets (general path)
    gfill: np.ndarray  #: (ngroups,) int64: group fill (general path)
    gids: np.ndarray  #: int64: a group's access ids (block path, else empty)
    gwts: np.ndarray  #: float64: their bytes
    # ---- per tensor
    loc: np.ndarray  #: (4, T) float64: a wave's sums before scaling
    s15w: np.ndarray  #: (n_step,) float64: L1.5 hit sums per access position
    cp: np.ndarray  #: (T, conc) int64: candidate positions (block paths)
    ck: np.ndarray  #: (T, conc) int64: candidate block ids
    clen: np.ndarray  #: (4 T,) int64: candidate counts, read pointers, covered columns
    # ---- L1.5 group layouts
    rsc: np.ndarray  #: (5, runs) int64: first programs of a wave's group runs
    sigbuf: np.ndarray  #: int64: a group's layout


class Memo(NamedTuple):
    """The per-problem memo tables (all in/out): a hit returns the stored
    result of the very same computation, so no memo changes a value."""

    # ---- SDCM hit probabilities keyed by the exact distance (keys -1: empty)
    memo15_k: np.ndarray  #: float64: L1.5 keys
    memo15_v: np.ndarray  #: float64: L1.5 values
    memo2_k: np.ndarray  #: float64: L2 keys
    memo2_v: np.ndarray  #: float64: L2 values
    # ---- cross-wave hits of a wave, keyed by (wave, previous wave, bytes)
    xtag: np.ndarray  #: int64: the wave a slot belongs to (-1: free)
    xwp: np.ndarray  #: int64
    xs: np.ndarray  #: float64
    xval: np.ndarray  #: float64
    # ---- L1.5 group patterns (canonical labels) and their pooled probabilities
    pat_m: np.ndarray  #: int64: pattern length (-1: free)
    pat_hash: np.ndarray  #: int64
    pat_off: np.ndarray  #: int64: pool offset; the last entry: pool fill
    pool_lab: np.ndarray  #: int64
    pool_h15: np.ndarray  #: float64
    # ---- L1.5 group layouts (tsbatch.kernels.reuse._group_sig)
    sig_tab: np.ndarray  #: (slots, 2 + width) int64: length (-1: free), pool offset, layout
    sig_hash: np.ndarray  #: int64
    sig_s15: np.ndarray  #: (slots, n_step) float64: per-position L1.5 hit sums


class Batch(NamedTuple):
    """A batch of cache problems, one row each (``reuse.cache_hit_rates``'s
    columns, contiguous), its sampling and its outputs."""

    # ---- per problem ``i``: the launch
    g0: np.ndarray  #: (n,) int64: grid rows
    g1: np.ndarray  #: (n,) int64: grid columns
    g2: np.ndarray  #: (n,) int64: grid planes
    order: np.ndarray  #: (n,) int64: launch order code
    group: np.ndarray  #: (n,) int64: the order's group size
    conc: np.ndarray  #: (n,) int64: tiles resident at once (a wave)
    ksteps: np.ndarray  #: (n,) int64: reduction steps
    # ---- per problem and tensor
    mask: np.ndarray  #: (n, T) int64: bit mask of reuse dimensions
    per_step: np.ndarray  #: (n, T) int64: read every step (1) or once per tile (0)
    tbytes: np.ndarray  #: (n, T) float64: block bytes
    # ---- per problem: the caches
    cap2: np.ndarray  #: (n,) float64: L2 bytes
    assoc2: np.ndarray  #: (n,) float64
    nsm: np.ndarray  #: (n,) int64: SMs
    g15: np.ndarray  #: (n,) int64: SMs per L1.5 group (0: no L1.5 tier)
    cap15: np.ndarray  #: (n,) float64: L1.5 bytes
    assoc15: np.ndarray  #: (n,) float64
    # ---- sampling and path, for the whole batch
    k_samples: int  #: sampled reduction steps
    max_waves: int  #: analysed waves (>= 2)
    max_lookback: int  #: waves of lookback (>= 1)
    fast: bool  #: the fast path (else the general one)
    weights: bool  #: interior sampled waves weighted for their share
    #: per-step tensors of zero bytes get ``(0, 0, 1)`` and leave the sequence where
    #: that is exact (``reuse._live_tensors``); else they are accessed as any other
    drop_zero: bool
    #: the waves only book-kept, with block sizes of any value, per distinct block in
    #: the per-access order (``reuse._hits_blocks`` / ``_book_blocks`` with ``seq``)
    seq_book: bool
    #: the problems with a closed form solved by it: one-column grids
    #: (``reuse._cache_column``) and plane-keyed grids (``reuse._cache_planes``);
    #: off, simulated wave by wave as any other
    column: bool
    #: a per-step tensor with a block per tile (the last id range) keyed by its
    #: tile's position in the wave, not its tile (``reuse._wave``); off, by its tile
    pos_keys: bool
    #: two consecutive per-step tensors of equal reuse and bytes (swiglu's B and
    #: B_up) simulated as one of twice the bytes whose own distances take the
    #: partner's bytes (``reuse._pair_tensors``); off, access by access
    pairs: bool
    # ---- outputs (n, T) float64, written
    h15: np.ndarray
    h2: np.ndarray
    dram: np.ndarray
