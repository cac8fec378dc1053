"""Prologue-steady-epilogue envelope and wave aggregation.

TileSight §3.4, Eq. 2-5 and Algorithm 2. A tile's work is a resource
vector (Eq. 1) over ``R_NAMES``: per reduction-loop iteration
(``work_iter``) and once per tile after the loop (``work_epi``), in FLOPs
or bytes. Rates turn work into time: private resources (tensor core, CUDA
core, SFU, shared memory, L1.5) at a per-SM rate, shared ones (L2, DRAM,
network) at the chip rate divided among the active SMs, which is why a
tail wave with fewer active SMs runs its memory phases faster.

With ``p`` resident tiles interleaved on an SM the loop has ``N = p K``
iterations and ``d = p (stages - 1)`` loads in flight. Then

Eq. 2, ``T = T_pro + max(N - d, 0) T_steady + T_epi``, is taken as follows

with ``T_steady = max(compute, memory, (L + memory) / d)``: independent
resources overlap (Eq. 4, the best order of a load-compute body is the one
that overlaps them), and a software pipeline issues the load of iteration
``i + stages - 1`` as iteration ``i`` starts, so ``stages - 1`` iterations
of one tile (times ``p`` interleaved tiles) hide one load latency ``L``.
Without prefetch (``stages = 1``, ``d = 0``) each tile's load, wait and
compute run back to back and only the tiles interleave:
``(L + memory + compute) / p``. This replaces the paper's effective depth
``stages p - 1`` with a ``(L + memory + compute)`` numerator (Eq. 3),
which let two-stage pipelines hide twice the latency they can: measured
two-stage 128x128x32 tiles ran 1.17x (A100) and 1.29x (H100) above it.
Near the knee of those bounds (the loads in flight barely cover the latency)
the ring's ``p * stages`` slots wait for each other at the memory system,
which serves every SM's requests in turn: the steady iteration is at least
the time per completion of exact mean-value analysis of those slots cycling
through a delay ``L + compute`` and a queue of the busiest memory resource's
demand ``memory`` (:func:`_ring_queue`); far from the knee that is the bound
itself (memory-bound H100/H200 Triton GEMMs ran 12-20 % above the bare
maximum; docs/gemm_accuracy.md, "Triton accuracy, session 2").
The first load lands after ``T_pro = L + memory``; the ``N - 1`` iterations
after it run at ``T_steady`` (at ``max(compute, memory)`` when ``N <= d``:
every load of the loop is then in flight from its start, so no latency
bound between them); the last iteration's compute and the tiles' epilogue
end it: ``T_epi = compute + p * epilogue + tile overhead``. So
``T = T_pro + (N - 1) T_steady + T_epi``. The paper's fill ``L + d memory``
and drain ``d compute`` count ``(d - 1) min(memory, compute)`` twice: a few
percent of a long GEMM loop, and, for a loop no longer than the loads in
flight (attention over a few key blocks, a small-K GEMM), all of its memory
serialised with all of its compute (the A100 FlexAttention bodies ran
1.4x faster than that predicted). The loop's bookkeeping
(``ovh_iter``) is work added to the busiest resource where the family has
no chain (GEMM), and one more serial segment of the chain where it has one
(tile programs: the chain already holds the iteration's dependent issue).
Within a wave the ``p`` resident tiles run out of step: the other
``p - 1`` tiles' once-per-tile work (a prologue load of a resident operand,
the output stores) runs under a tile's loop, up to the loop's length, so
``T_epi`` pays ``p * epilogue - min((p - 1) epilogue, T_steady)``; and a wave
never takes less than its busiest resource's time for all its tiles plus
one latency (the measured single-wave FlexAttention bodies of 5 tiles per
SM ran 1.3-1.4x faster than their Q loads, loop and O stores back to back).

Consecutive waves overlap at their seam: output stores retire
asynchronously, so the next wave's prologue (load latency and pipeline
fill) runs under the previous wave's stores and only the longer of the two
counts, ``T_waves = sum(T_wave) - sum(min(T_pro(next), T_store(prev)))``;
stores still draining after that prologue also run under the next wave's
loop and last compute step, never taking a wave below its busiest
resource's time (:func:`resource_floor`). After the first wave, with ``p > 1`` resident slots, the
slots run out of step: the other slots keep working under all but ``1/p`` of
the stores still exposed, down to the wave's busiest-resource time
(:func:`resource_floor`). So a short-loop kernel of many waves (attention
over a few key blocks, a small-K GEMM) streams its output stores under other
tiles' work instead of paying them once per wave. Where the busiest resource
is a memory one and a share ``beta`` of its work comes once per tile (Q
loads, output stores: bursts at a tile's start and end), the out-of-step
slots also queue for it: that share of the wave takes the time of a closed
queueing network of ``p`` slots (exact mean-value analysis: a queue with the
busiest resource's demand per tile and a delay of the rest of one slot's own
wave), when that is longer, and never more than the same wave alone
(:func:`_queued_wave`, :func:`_busiest`). Between the two bounds,
one slot's serial path and the busiest resource, the slots wait for each
other; the max of the two bounds ranked configurations near a DRAM floor
equal that measured 5-15 % apart (A100 FlexAttention).
Without this, a short-K, many-wave GEMM pays one exposed load latency per
wave on top of its store-bandwidth time.

Compute-class resources run at a fraction ``min(1, p w / w_full)`` of their
rate when the resident warps ``p w`` cannot occupy all ``w_full`` issue
slots (sub-partitions). Conversely, when more than one issue group (a
Hopper warpgroup: ``w_full`` warps) shares the SM's tensor cores
(``p w > w_full``), the tensor-core rate is scaled by ``share_eff``: the
groups' asynchronous MMA chains are arbitrated onto the same units and
lose issue slots that a single group issuing back to back keeps
(1 = no loss; set per row by the lowering, e.g. only for warpgroup MMA).
"""

from __future__ import annotations

import math

import numpy as np

from tsbatch.kernels._config import jit_borrow, jit_exact, jit_scalar
from tsbatch.kernels._threads import even_bounds, run_shares

__all__ = [
    "R_NAMES",
    "R_TC",
    "R_CUDA",
    "R_SFU",
    "R_SMEM",
    "R_L15",
    "R_L2",
    "R_DRAM",
    "R_NET",
    "R_ALU",
    "N_RES",
    "SHARED",
    "COMPUTE",
    "envelope_one",
    "wave_time",
    "l15_chip_floor",
    "clock_factor",
    "evaluate_envelopes",
]

R_TC, R_CUDA, R_SFU, R_SMEM, R_L15, R_L2, R_DRAM, R_NET, R_ALU = range(9)
N_RES = 9
#: ``cuda_core`` is the FP32 FMA pipe (FLOPs, an elementwise operation 2);
#: ``alu`` the integer/logic pipe beside it (operations: compare, min/max,
#: select, integer index arithmetic, FP32 to 16-bit conversion), which issues
#: from its own dispatch port and runs concurrently
R_NAMES = ("tensor_core", "cuda_core", "sfu", "smem", "l15", "l2", "dram", "net", "alu")
#: resources whose chip-wide rate is divided among the active SMs
SHARED = np.array([0, 0, 0, 0, 0, 1, 1, 1, 0], dtype=np.int64)
#: compute-class resources (the others are memory-class)
COMPUTE = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1], dtype=np.int64)


@jit_scalar
def _rate_on_sm(rr, is_shared, is_compute, is_tc, active, f, shared_units, share_eff):
    """A resource's rate for one SM's tiles (0 when the chip lacks it): a shared
    resource's chip rate divided among the active SMs, a compute resource at
    the issue-slot fraction ``f``, the tensor cores at ``share_eff`` when
    several issue groups share them."""
    if rr <= 0.0:
        return 0.0
    if is_shared != 0:
        rr = rr / active
    if is_compute != 0:
        rr = rr * f
    if is_tc and shared_units:
        rr = rr * share_eff
    return rr


#: :func:`wave_time`'s ``terms`` bits: the out-of-step slots' queued wave (needs
#: TERM_WAVE_FLOOR), the ring's queue at the memory in the loop, instead of it a
#: lower bound of it (:func:`_ring_queue_floor`), and the busiest resource's time
#: as the floor of a wave's increment and of the tail's (between waves)
TERM_QUEUED_WAVE = 1
TERM_RING = 2
TERM_RING_FLOOR = 4
TERM_WAVE_FLOOR = 8
#: the model's terms
MODEL_TERMS = TERM_QUEUED_WAVE | TERM_RING | TERM_WAVE_FLOOR
#: the screen's lower bound's: a floor of the ring's queue, nothing else. Each
#: term only ever adds time; without the queued wave (the one term not
#: non-decreasing in the work) the envelope is non-decreasing in every work
#: entry and in each wave's steady iteration (tests/test_kernels.py)
BOUND_TERMS = TERM_RING_FLOOR
#: mean-value steps of :func:`_ring_queue_floor`
RING_FLOOR_STEPS = 1
#: utilisation at which :func:`_ring_queue` stops its recursion
RING_SATURATED = 1e-9


@jit_scalar
def _ring_queue(z, dem, n):
    """Time per iteration of ``n`` customers cycling through a delay ``z`` and a
    queue of demand ``dem`` (exact mean-value analysis, Reiser and Lavenberg
    1980): ``1 / X(n)``, which tends to ``max(dem, (z + dem) / n)`` far from the
    knee and lies above both near it. Returned as ``min(max(1 / X(n), dem / (1 -
    RING_SATURATED)), z + dem)`` (within 1e-9 of ``1 / X(n)``), so that the
    recursion can stop at saturation and the answer stays non-decreasing in
    ``z`` and ``dem``."""
    q = 0.0
    x = 0.0
    for c in range(1, n + 1):
        r = dem * (1.0 + q)
        x = c / (z + r)
        q = x * r
        if x * dem > 1.0 - RING_SATURATED:
            # saturated (the utilisation only grows with the customers): the
            # answer is then dem / (1 - RING_SATURATED), never more than one
            # customer's cycle; this keeps it non-decreasing in z and dem
            # (1 / X(c) at the stop would fall when z grows and the stop moves on)
            s = dem / (1.0 - RING_SATURATED)
            return s if s < z + dem else z + dem
    return 1.0 / x if x > 0.0 else 0.0


@jit_scalar
def _ring_queue_floor(z, dem, n, steps):
    """A lower bound of :func:`_ring_queue` in at most ``steps + 1`` steps: the
    mean-value recursion run from customer ``m = max(n - steps, 1)`` only, from
    ``R(m) >= dem (1 + (m - 1) dem / (z + dem))`` (exact for ``m = 1``): the
    queue met by an arrival, ``Q(c - 1) = (c - 1) R(c - 1) / (z + R(c - 1))``, is
    increasing in ``R(c - 1) >= dem``, so each step keeps ``R(c)`` at or below the
    exact one; ``(z + R(n)) / n`` less a relative 1e-9 (the exact recursion's
    rounding, and its answer at saturation, ``dem / (1 - 1e-9)``, lie above)."""
    m = n - steps
    if m < 1:
        m = 1
    r = dem * (1.0 + (m - 1) * dem / (z + dem))
    for c in range(m + 1, n + 1):
        r = dem * (1.0 + (c - 1) * r / (z + r))
    return (z + r) / n * (1.0 - 1e-9)


@jit_scalar
def _exposed_copy(c0, f, warps_tile, warps_full, chain, ovh_iter, sync, expose, p):
    """Steady iteration (us) of ``p`` resident tiles whose loop does not prefetch
    (``expose``: the copy's latency and transfer, :func:`envelope_one`).

    A tile's own iteration is its issue on its schedulers, ``c0 f warps_full /
    min(warps_tile, warps_full)`` (``c0``: the SM's compute time of one tile's
    iteration at the issue fraction ``f``; a tile's warps hold ``min(warps_tile,
    warps_full)`` of the ``warps_full`` schedulers), or its warps' chain with the
    loop's bookkeeping where that is longer; then its barrier stall ``sync``; then
    the copy of the next tile, for which all its warps wait at the barrier. The
    other resident tiles issue in that wait (out of step, as the barrier stall's
    ``(comp + sync) / p``): ``p`` tile iterations per tile's own, ``t_own / p``."""
    ws = warps_tile if warps_tile < warps_full else warps_full
    if ws <= 0.0:
        ws = 1.0
    own = c0 * f * warps_full / ws
    if chain > 0.0:
        if chain + ovh_iter > own:
            own = chain + ovh_iter
    else:
        own += ovh_iter
    return (own + sync + expose) / p


# not IR-inlined: four call sites (cold compile 14 s -> ~4 s); compiled without
# numba's runtime, as _envelopes (jit_borrow: it allocates nothing, and its
# arrays are borrowed from the caller, so a call counts no references: the
# bound's envelope of 1M rows 0.172 -> 0.13 s with both)
@jit_borrow
def envelope_one(work_iter, work_epi, rate, shared, compute, p, active, ksteps, stages,
                 warps_tile, warps_full, lat, ovh_iter, ovh_tile, persist_tiles, share_eff=1.0, sync=0.0,
                 chain=0.0, streams=1.0, ring=1, expose=0.0, l15_share=1.0):
    """Envelope of one SM's share of one wave (or of a persistent run).

    Returns ``(T, T_pro, T_steady_total, T_epi, T_steady_iter, T_store,
    T_own)`` in the units of ``1 / rate`` (microseconds when rates are per
    microsecond); ``T_store`` is the part of ``T_epi`` spent on the tiles'
    epilogue work (output stores), which the next wave's prologue can run
    under; ``T_own`` is all of the tiles' epilogue work, before the part the
    loop hides (out of step): the loop time that hides it cannot also hide
    the stores of the wave before.
    ``persist_tiles > 0`` models a persistent program running that many
    tiles back to back: its stores drain inside the loop. ``chain`` is the
    critical path of one iteration in one issue stream at the SM's full rates
    (0: none beyond the resource sums) and ``streams`` the issue streams per
    tile; the ``p * streams`` streams on the SM interleave their chains.
    ``ring=0`` leaves out the ring's queueing at the memory (:func:`_ring_queue`),
    which only ever raises the steady iteration: a lower bound (the screen's).
    ``expose`` (us, 0: none) marks a loop that does not prefetch although it has
    two stages (Triton's 2-stage FMA dot: the copy of the next tile is issued after
    the iteration's last shared load and waited for at once): that copy's latency
    and transfer, which each iteration exposes (:func:`_exposed_copy`); the loop's
    steady iteration is at least :func:`_exposed_copy`'s.
    ``l15_share`` (1: none) divides the L1.5 tier's time where it is a rate over
    the wave (the loop's bandwidth bound, the ring's queue at the memory, the
    wave's busiest-resource floor), not where it is one request's transfer (the
    latency bound, the first load): :func:`_l15_share`.
    """
    f = p * warps_tile / warps_full
    shared_units = f > 1.0  # several issue groups share the tensor cores
    if f > 1.0:
        f = 1.0
    comp = 0.0
    mem = 0.0
    mem_l = 0.0  # the memory time of one iteration's requests, unshared
    epi = 0.0
    floor = 0.0
    for r in range(work_iter.shape[0]):
        rr = _rate_on_sm(rate[r], shared[r], compute[r], r == R_TC, active, f, shared_units,
                         share_eff)
        if rr <= 0.0:
            continue
        u = work_iter[r] / rr
        e = work_epi[r] / rr
        if persist_tiles > 0 and compute[r] == 0:
            u += e / ksteps
            e = 0.0
        sh = l15_share if r == R_L15 else 1.0
        if compute[r] != 0:
            if u > comp:
                comp = u
        else:
            if u > mem_l:
                mem_l = u
            if u / sh > mem:
                mem = u / sh
        if e > epi:
            epi = e
        fl = (work_iter[r] * ksteps + work_epi[r]) / rr / sh
        if fl > floor:
            floor = fl
    floor *= persist_tiles if persist_tiles > 0 else p
    c0 = comp  # the compute resources' issue time, before the waits below
    if chain <= 0.0:
        comp += ovh_iter
    if sync > 0.0:
        # the loop's barrier stall: the tile's warps wait, the tensor cores idle
        # unless another resident tile has work (a round of p iterations takes
        # max(p comp, comp + sync))
        hid = (comp + sync) / p
        comp = comp if comp > hid else hid
    if chain > 0.0:
        # the best issue order's chain of one iteration (tsbatch.kernels.dag),
        # plus the loop's bookkeeping (index and address arithmetic, the
        # async-copy wait) as one more serial segment of it: the p tiles'
        # `streams` issue streams each interleave their chains
        q = p * streams
        c = (chain + ovh_iter) / q if q > 0.0 else chain + ovh_iter
        comp = comp if comp > c else c
    tiles = persist_tiles if persist_tiles > 0 else p  # tiles this SM runs
    n_it = tiles * ksteps
    # loads in flight: each tile prefetches stages - 1 iterations ahead
    d = p * (stages - 1)
    if d < 0:
        d = 0
    steady = comp
    if mem > steady:
        steady = mem
    if d > 0:
        # the load for iteration i + stages - 1 is issued as iteration i starts
        # and must land before that iteration: (stages - 1) iterations hide
        # one latency, and p tiles interleave
        lat_bound = (lat + mem_l) / d
    else:
        # no prefetch: each tile's load, wait and compute run back to back
        # (p tiles interleave)
        lat_bound = (lat + mem_l + comp) / p
    if lat_bound > steady:
        steady = lat_bound
    if expose > 0.0:
        # a loop that does not prefetch: each tile's iteration waits for the copy
        # of the next tile, issued after its last shared load (_exposed_copy)
        xb = _exposed_copy(c0, f, warps_tile, warps_full, chain, ovh_iter, sync, expose, p)
        if xb > steady:
            steady = xb
    if ring != 0 and d > 0 and mem > 0.0 and steady < lat + comp + mem:
        # the ring's p * stages slots queue at the memory system, which serves
        # the requests of every SM in turn: exact mean-value analysis of a closed
        # loop of those slots through the load latency and this SM's compute
        # (delays) and the memory (a queue of demand `mem` per iteration); never
        # longer than one slot's whole cycle, so not solved where the bounds reach it
        if ring == 1:
            qm = _ring_queue(lat + comp, mem, d + p)
        else:
            qm = _ring_queue_floor(lat + comp, mem, d + p, RING_FLOOR_STEPS)
        if qm > steady:
            steady = qm
    # the first load lands after one latency and its transfer, the last
    # iteration's compute ends the loop, and the n_it - 1 iterations between
    # run at the steady rate; a loop no longer than the loads in flight has
    # every load issued at its start, so no latency bound between them
    step = steady
    if d > 0 and n_it <= d:
        step = comp if comp > mem else mem
    t_pro = lat + mem_l
    t_st = (n_it - 1) * step if n_it > 1 else 0.0
    hide = 0.0
    if persist_tiles <= 0 and p > 1:
        hide = (p - 1) * epi
        if hide > t_st:
            hide = t_st
    t_epi = comp + p * epi - hide + tiles * ovh_tile
    tot = t_pro + t_st + t_epi
    # what is still in flight when the last compute step ends, for the next wave
    # to run its prologue under: the exposed stores, and, where the busiest
    # resource binds the wave, its work beyond the pipeline's estimate (so that a
    # wave held at that floor hides no more when its stores grow: a slower DRAM
    # once made a grid faster)
    drain = p * epi - hide
    if tot < lat + floor:
        t_epi += lat + floor - tot
        drain += lat + floor - tot
        tot = lat + floor
    return tot, t_pro, t_st, t_epi, steady, drain, p * epi


@jit_scalar
def _busiest(work_iter, work_epi, rate, shared, compute, p, active, ksteps, warps_tile,
             warps_full, share_eff):
    """``(time, burst)``: the busiest resource's time for ``p`` tiles on one SM
    (all their loop iterations and once-per-tile work) at the rates
    :func:`envelope_one` uses, and, where that resource is a memory one, the
    share of its work that comes once per tile (a prologue load, the output
    stores: bursts at a tile's start and end rather than spread over the
    loop; 0 for a compute resource)."""
    f = p * warps_tile / warps_full
    shared_units = f > 1.0
    if f > 1.0:
        f = 1.0
    top = 0.0
    burst = 0.0
    for r in range(work_iter.shape[0]):
        rr = _rate_on_sm(rate[r], shared[r], compute[r], r == R_TC, active, f, shared_units,
                         share_eff)
        if rr <= 0.0:
            continue
        u = p * (ksteps * work_iter[r] + work_epi[r]) / rr
        if u > top:
            top = u
            burst = 0.0
            if compute[r] == 0:
                burst = work_epi[r] / (ksteps * work_iter[r] + work_epi[r])
    return top, burst


@jit_scalar
def resource_floor(work_iter, work_epi, rate, shared, compute, p, active, ksteps, warps_tile,
                   warps_full, share_eff=1.0):
    """The busiest resource's time for ``p`` tiles on one SM (all their loop
    iterations and once-per-tile work), at the rates :func:`envelope_one` uses."""
    return _busiest(work_iter, work_epi, rate, shared, compute, p, active, ksteps, warps_tile,
                    warps_full, share_eff)[0]


@jit_scalar
def _seam(a, b, c, t, store, own1, own2, floor):
    """What a wave ``(t, a, b, c)`` hides of the stores ``store`` still draining
    from the wave before it: ``h`` under its prologue ``a``, then ``hf`` under
    its loop and last compute step (``b + c`` less ``own1 + own2``, all its own
    stores and tile overheads), never taking it below ``floor`` (its busiest resource);
    ``hf_c`` is the part of ``hf`` taken off its drain ``c`` (the rest off ``b``)."""
    h = a if a < store else store
    hf = b + c - own1 - own2
    if store - h < hf:
        hf = store - h
    if hf < 0.0:
        hf = 0.0
    cap = t - floor if t > floor else 0.0
    if h + hf > cap:
        h = h if h < cap else cap
        hf = cap - h
    hf_c = hf if hf < c else c
    return h, hf, hf_c


@jit_scalar
def _queued_wave(work_iter, work_epi, rate, shared, compute, p, sms, ksteps, stages,
                 warps_tile, warps_full, lat, ovh_iter, ovh_tile, share_eff, sync, chain,
                 streams, floor, expose=0.0):
    """A full wave of ``p`` out-of-step slots queueing at the busiest resource:
    exact mean-value analysis (Reiser and Lavenberg 1980) of a closed network
    of ``p`` customers (the slots), each cycling through one tile: a queue
    whose demand per tile is the busiest resource's time, ``floor / p``, and a
    delay, the rest of what one slot alone takes per wave (its own wave
    increment, seam included, less that demand). With one slot that is the
    slot's own increment; with many it tends to ``floor``; in between the
    slots wait for each other at the busiest resource, which a max of the two
    bounds does not see."""
    dem = floor / p
    if dem <= 0.0:
        return 0.0
    # np.int64(...), not literal ints: a literal argument makes numba compile a
    # specialization of its own (three of envelope_one instead of one)
    t1, a1, b1, c1, _s1, st1, own1 = envelope_one(work_iter, work_epi, rate, shared, compute,
                                                  np.int64(1), sms, ksteps, stages, warps_tile,
                                                  warps_full, lat, ovh_iter, ovh_tile,
                                                  np.int64(0), share_eff, sync, chain, streams,
                                                  np.int64(1), expose)
    fl1 = resource_floor(work_iter, work_epi, rate, shared, compute, 1, sms, ksteps,
                         warps_tile, warps_full, share_eff)
    h1, hf1, _hc = _seam(a1, b1, c1, t1, st1, own1, ovh_tile, fl1)
    z = t1 - h1 - hf1 - dem
    if z < 0.0:
        z = 0.0
    # the p slots' mean-value analysis (the loop's ring queue's, with its stop at
    # saturation): p completions per 1 / X(p)
    return p * _ring_queue(z, dem, p)


@jit_scalar
def _l15_share(tail, sms, pt):
    """The L1.5 rate factor of the busiest SMs of a wave of ``tail`` tiles (``pt``
    on the busiest SMs, ``ceil(tail / sms)``): the tier is a path of a group of
    SMs (``l15_group_sms``) whose rate the model gives per SM as the chip's share;
    where a wave leaves some busy SMs one tile fewer than the busiest, their
    share goes to the tiles of the others, so the busiest SMs' tiles get the
    mean share of the busy SMs' tiles: ``pt`` over the mean tiles of a busy SM,
    ``pt min(tail, sms) / tail`` (1 for an even wave, below 2 always)."""
    if pt <= 1:
        return 1.0
    active = tail if tail < sms else sms
    return pt * active / tail


@jit_scalar
def wave_time(work_iter, work_epi, rate, shared, compute, tiles, sms, p, ksteps, stages,
              warps_tile, warps_full, lat, ovh_iter, ovh_tile, persistent, share_eff=1.0, sync=0.0,
              chain=0.0, streams=1.0, terms=MODEL_TERMS, conv=0.0, expose=0.0, tail_tc=0.0,
              tail_smem=1.0, tail_cuda=1.0):
    """Whole-grid time by waves (Algorithm 2): full waves plus a recomputed tail.

    ``tail_tc > 0`` (the power-limited clock by waves of resident slots, GEMM's
    Triton tensor-core rows on warpgroup-MMA GPUs; docs/gemm_accuracy.md, "The
    power-limited clock by waves, session 13"): the full waves run at ``rate``
    (the rates of a grid whose every slot is busy: ``tc_efficiency``, the
    measured clock) and the tail, the last wave of fewer than ``sms * p``
    tiles, which draws the power of its busy slots only, at the tensor rate
    times ``tail_tc``, the shared-memory and CUDA-core rates times ``tail_smem``
    and ``tail_cuda`` (their maximum clock), with its busiest SMs' L1.5 time
    shared over the wave's busy SMs (:func:`_l15_share`); never faster than its
    share of the slots, ``tail / (sms p)``, of a full wave at ``rate`` (the
    chip's power over the wave). 0: every wave at ``rate``.

    ``conv`` (us, 0: none) is a tile's epilogue layout conversion through shared
    memory before its stores can issue (Triton's Hopper wgmma tiles): between
    full waves the ``p`` slots of an SM turn over together (they started the
    wave together at equal rates), and no block of the next wave can start
    before the block it replaces has exited, i.e. converted its tile and issued
    its C stores out of the SM (``issue``: the tile's L2 store bytes at the SM's
    share of the chip's L2 rate); the ``p`` slots pipeline the conversions
    (shared memory) and the issues (the path to L2): each full wave after the
    first takes at least its own time less its stores' drain (which may run
    under the next wave) plus ``p * max(conv, issue) + min(conv, issue)``. Only
    ever adds time.

    Returns ``(T, T_pro, T_steady, T_epi, steady_iter, waves, tail_tiles)``.
    ``terms`` (bits :data:`TERM_QUEUED_WAVE`, :data:`TERM_RING`,
    :data:`TERM_RING_FLOOR`, :data:`TERM_WAVE_FLOOR`; the model:
    :data:`MODEL_TERMS`) keeps terms that only ever add time: the out-of-step
    slots' queueing for a burst-fed busiest resource between waves
    (:func:`_queued_wave`), the ring's slots' queueing at the memory in the
    loop (:func:`_ring_queue`, ``ring`` of :func:`envelope_one`) or a floor of
    it, and the busiest resource's time as the floor of the waves after the
    first and of the tail (:func:`_busiest`, :func:`resource_floor`). The rest is
    non-decreasing in every work entry and in each wave's steady iteration
    (prologue, loop, epilogue and the seams between waves are maxima and minima
    of non-decreasing terms, docs/gemm_accuracy.md, "Speed, session 3"), so the
    screen's lower bound takes them out. With the queued wave the latency can
    fall where the busiest resource's loop work grows (its burst share
    ``beta`` shrinks); the ring queue is non-decreasing in its delay and
    demand, but costs ~40 % of the bound's envelope for ~0.3 % of its rows.
    """
    conc = sms * p
    ring = 1 if (terms & TERM_RING) != 0 else (2 if (terms & TERM_RING_FLOOR) != 0 else 0)
    if persistent != 0:
        per_sm = (tiles + sms - 1) // sms
        active = sms if tiles > sms else tiles
        t, a, b, c, s, _, _ = envelope_one(work_iter, work_epi, rate, shared, compute, p,
                                           active, ksteps, stages, warps_tile, warps_full, lat,
                                           ovh_iter, ovh_tile, per_sm, share_eff, sync, chain,
                                           streams, ring, expose)
        return t, a, b, c, s, (tiles + conc - 1) // conc, tiles % conc
    full = tiles // conc
    tail = tiles - full * conc
    T = 0.0
    tp = 0.0
    ts = 0.0
    te = 0.0
    s_it = 0.0
    store = 0.0
    t_full = 0.0
    if full > 0:
        t, a, b, c, s, store, own = envelope_one(work_iter, work_epi, rate, shared, compute,
                                                 p, sms, ksteps, stages, warps_tile, warps_full,
                                                 lat, ovh_iter, ovh_tile, np.int64(0), share_eff,
                                                 sync, chain, streams, ring, expose)
        t_full = t
        # stores retire asynchronously: the next wave's prologue (load latency
        # and pipeline fill) runs under the previous wave's output stores. Written
        # as one wave plus (full - 1) waves less the hidden part, not full waves
        # less (full - 1) hidden parts: the difference of two products of
        # `full` loses digits when the prologue is mostly hidden
        floor = 0.0
        beta = 0.0
        if (terms & TERM_WAVE_FLOOR) != 0:
            floor, beta = _busiest(work_iter, work_epi, rate, shared, compute, p, sms, ksteps,
                                   warps_tile, warps_full, share_eff)
        h, hf, hf_c = _seam(a, b, c, t, store, own, p * ovh_tile, floor)
        inc = t - h - hf
        if p > 1 and full > 1:
            # the stores still exposed after the seam: after the first wave the p
            # resident slots run out of step, and the others keep working under
            # all but a 1/p share of them, down to the wave's busiest resource
            cut = inc - (1.0 - 1.0 / p) * (store - h - hf)
            if floor > cut:
                cut = floor
            if cut < inc:
                inc = cut
            # but where the busiest resource is a memory one fed in bursts (once per
            # tile), the out-of-step slots queue for it: that share of its demand
            # waits as in a closed queue of p slots, never less than the above
            if (terms & TERM_QUEUED_WAVE) != 0 and beta > 0.0:
                qd = _queued_wave(work_iter, work_epi, rate, shared, compute, p, sms, ksteps,
                                  stages, warps_tile, warps_full, lat, ovh_iter, ovh_tile,
                                  share_eff, sync, chain, streams, floor, expose)
                if qd > t:
                    qd = t  # never more than the wave alone, from scratch
                if qd > inc:
                    inc += beta * (qd - inc)
        # the slots' turnover between full waves: a non-persistent block's
        # successor is launched only once the block has exited, and it exits
        # after its layout conversion (the SM's shared memory) and after its C
        # stores have been issued out of the SM (at its share of the chip's L2
        # rate: every SM turns over at once); only their drain past the L2 may
        # run under the next wave. The p slots, in step, pipeline the two over
        # the two paths (p x the longer plus one of the shorter), so a later
        # wave takes at least its own time less its stores' drain plus that
        # (t - store does not fall when work rises; the next block's prologue
        # is in t, exposed)
        turn = 0.0
        if conv > 0.0:
            issue = 0.0
            if rate[R_L2] > 0.0:
                issue = work_epi[R_L2] * sms / rate[R_L2]
            hi = conv if conv > issue else issue
            lo = conv + issue - hi
            turn = t - store + p * hi + lo - inc
            if turn < 0.0:
                turn = 0.0
        inc += turn
        T += t + (full - 1) * inc
        tp += a + (full - 1) * (a - h)
        ts += b + (full - 1) * (b - (hf - hf_c))
        te += c + (full - 1) * (c - hf_c + turn)
        s_it = s
    if tail > 0:
        active = tail if tail < sms else sms
        pt = (tail + sms - 1) // sms
        r_tc = rate[R_TC]
        r_smem = rate[R_SMEM]
        r_cuda = rate[R_CUDA]
        r_l15 = rate[R_L15]
        if tail_tc > 0.0:
            # the tail wave's rates (the docstring's tail_tc), in place while it
            # runs, put back below
            rate[R_TC] = r_tc * tail_tc
            rate[R_SMEM] = r_smem * tail_smem
            rate[R_CUDA] = r_cuda * tail_cuda
            sh15 = _l15_share(tail, sms, pt)
        else:
            sh15 = 1.0
        t, a, b, c, s, _, own_t = envelope_one(work_iter, work_epi, rate, shared, compute, pt,
                                               active, ksteps, stages, warps_tile, warps_full, lat,
                                               ovh_iter, ovh_tile, np.int64(0), share_eff, sync,
                                               chain, streams, ring, expose, sh15)
        floor = 0.0
        if (terms & TERM_WAVE_FLOOR) != 0:
            rate[R_L15] = r_l15 * sh15
            floor = resource_floor(work_iter, work_epi, rate, shared, compute, pt, active, ksteps,
                                   warps_tile, warps_full, share_eff)
            rate[R_L15] = r_l15
        if tail_tc > 0.0:
            rate[R_TC] = r_tc
            rate[R_SMEM] = r_smem
            rate[R_CUDA] = r_cuda
            rate[R_L15] = r_l15
            # the chip's power over the tail: its share of the slots of a full
            # wave at the full grid's rates (that wave's time is t_full)
            if full == 0:
                t_full = envelope_one(work_iter, work_epi, rate, shared, compute, p, sms, ksteps,
                                      stages, warps_tile, warps_full, lat, ovh_iter, ovh_tile,
                                      np.int64(0), share_eff, sync, chain, streams, ring,
                                      expose)[0]
            pf = t_full * tail / conc
            if pf > t:
                b += pf - t  # the raise is the loop's
                t = pf
        T += t
        tp += a
        ts += b
        te += c
        if full == 0:
            s_it = s
        hidden, hf, hf_c = _seam(a, b, c, t, store, pt * ovh_tile, own_t, floor)
        T -= hidden + hf
        tp -= hidden
        ts -= hf - hf_c
        te -= hf_c
    return T, tp, ts, te, s_it, full + (1 if tail > 0 else 0), tail


@jit_scalar
def l15_chip_floor(avg_iter, avg_epi, rate_l15, tiles, sms, ksteps, lat):
    """The chip-level floor of a grid's time on Hopper's L1.5 tier (the L2-side
    path, ``l15_bw_tbps``), launch left out: a line that misses the L2 is written
    into it by its DRAM fill and read out as a hit, so the path carries the
    grid's requested bytes and its DRAM fills at the chip's rate (``rate_l15``,
    the per-SM rate, times ``sms``), after one load latency ``lat``
    (docs/gemm_accuracy.md, "Hopper L1.5 fills as a chip floor, session 6").
    From the grid's average tile (``avg_iter``, ``avg_epi``: its L1.5 requests
    and DRAM bytes a step and once per tile) times its ``tiles``: totals that
    only grow with the problem, so the floor never falls where the work grows
    (a per-SM form priced from the average tile did: 164352d). 0 without an
    L1.5 tier (``rate_l15 <= 0``)."""
    chip = rate_l15 * sms
    if chip <= 0.0:
        return 0.0
    req = tiles * (ksteps * avg_iter[R_L15] + avg_epi[R_L15])
    fill = tiles * (ksteps * avg_iter[R_DRAM] + avg_epi[R_DRAM])
    return lat + (req + fill) / chip


@jit_borrow
def _envelopes(work_iter, work_epi, rate, shared, compute, tiles, sms, p, ksteps, stages,
               warps_tile, warps_full, lat, ovh_iter, ovh_tile, persistent, launch, share_eff, sync,
               chain, streams, terms, conv, expose, avg_iter, avg_epi, l15_floor, tail_tc, tail_smem,
               tail_cuda, out_t, out_pro, out_st, out_epi, out_it, out_waves, out_tail, out_util, want_util, lo,
               hi):
    R = work_iter.shape[1] if want_util else 0
    for i in range(np.uint64(lo), np.uint64(hi)):  # unsigned: no wraparound check per access
        if p[i] <= 0 or tiles[i] <= 0:
            out_t[i] = math.nan
            out_pro[i] = math.nan
            out_st[i] = math.nan
            out_epi[i] = math.nan
            out_it[i] = math.nan
            out_waves[i] = 0
            out_tail[i] = 0
            for r in range(R):
                out_util[i, r] = math.nan
            continue
        t, a, b, c, s, wv, tl = wave_time(work_iter[i], work_epi[i], rate[i], shared, compute,
                                          tiles[i], sms, p[i], ksteps[i], stages[i],
                                          warps_tile[i], warps_full, lat[i], ovh_iter[i],
                                          ovh_tile[i], persistent[i], share_eff[i], sync[i],
                                          chain[i], streams[i], terms, conv[i], expose[i],
                                          tail_tc[i], tail_smem[i], tail_cuda[i])
        total = t + launch[i]
        if l15_floor:
            fl = launch[i] + l15_chip_floor(avg_iter[i], avg_epi[i], rate[i, R_L15],
                                            float(tiles[i]), float(sms), float(ksteps[i]), lat[i])
            if fl > total:
                b += fl - total  # the raise is the loop's
                total = fl
        out_t[i] = total
        out_pro[i] = a
        out_st[i] = b
        out_epi[i] = c
        out_it[i] = s
        out_waves[i] = wv
        out_tail[i] = tl
        for r in range(R):  # R = 0: latency only
            chip = rate[i, r]
            if shared[r] == 0:
                chip = chip * sms
            if chip <= 0.0 or total <= 0.0:
                out_util[i, r] = 0.0
            else:
                busy = tiles[i] * (ksteps[i] * work_iter[i, r] + work_epi[i, r]) / chip
                u = busy / total
                out_util[i, r] = u if u < 1.0 else 1.0


@jit_exact
def clock_factor(rounds, busy, sms, cap):
    """Rate factor of the power-limited clock: the busiest SMs run
    ``rounds`` rounds of tiles, the last keeping ``busy`` of the ``sms`` busy at
    ``boost = min(cap, sms / busy)``, the earlier ones at the full grid's rate;
    one round is the boost itself, more the rounds' harmonic mean
    ``rounds / (rounds - 1 + 1 / boost)``. GEMM's lowering takes it over rounds
    of tiles per SM (``kernels_catalog.gemm._lower_rows``) where the envelope
    does not take the clock by waves (:func:`wave_time`'s ``tail_tc``)."""
    b = sms / (busy if busy > 1.0 else 1.0)
    if b > cap:
        b = cap
    if rounds == 1:
        return b
    return rounds / ((rounds - 1) + 1.0 / b)


def evaluate_envelopes(work_iter, work_epi, rate, tiles, sms, p, ksteps, stages, warps_tile,
                       warps_full, lat, ovh_iter, ovh_tile, persistent, launch, share_eff=None, sync=None,
                       latency_only=False, chain=None, streams=None, terms=None, conv=None,
                       l15_avg=None, expose=None, tc_cap=None, smem_cap=None, cuda_cap=None):
    """Batched :func:`wave_time` plus launch time and per-resource utilization.

    ``work_iter``, ``work_epi``, ``rate`` are ``(n, N_RES)``; rates in work
    units per microsecond (per SM for private resources, per chip for
    shared). Rows with ``p <= 0`` (infeasible) get NaN times.

    ``share_eff`` (per row, default 1) scales the tensor-core rate when
    several issue groups share an SM (:func:`envelope_one`); leaving it out
    can only make times shorter, so a caller computing a lower bound may;
    the same holds for ``chain`` (per row, default 0: no chain beyond the
    resource sums) with ``streams`` issue streams per tile (default 1).

    Returns a dict of arrays: ``latency_us, t_prologue_us, t_steady_us,
    t_epilogue_us, t_steady_iter_us, waves, tail_tiles, util`` (n, N_RES);
    ``latency_only=True`` leaves out ``util`` (the other arrays are the same).
    ``conv`` (per row, default 0): :func:`wave_time`'s layout conversion of a
    tile between full waves; it only adds time, so a lower bound may leave it out.
    ``terms`` (default :data:`MODEL_TERMS`): :func:`wave_time`'s terms kept
    (:data:`BOUND_TERMS`: a latency never above the model's, the screen's
    lower bound).
    ``l15_avg`` (default None: none): ``(avg_iter, avg_epi)``, the grid's average
    tile's work (``(n, N_RES)``, as ``work_iter`` where the grid has no edge
    tiles): each row's latency is raised to :func:`l15_chip_floor` plus its
    launch (the raise in ``t_steady_us``); it only adds time.
    ``tc_cap``, ``smem_cap``, ``cuda_cap`` (per row, default None: none): where
    ``tc_cap > 0`` the lowering left the power-limited clock to the envelope, which
    takes it by waves of resident slots (:func:`wave_time`'s ``tail_tc``,
    ``tail_smem``, ``tail_cuda``): the full waves at the rates given, the last,
    partly filled one at the tensor, shared-memory and CUDA-core rates times
    these caps (``smem_cap`` / ``cuda_cap`` default 1), never below its share of
    a full wave (the kernel scales a row's rates in place while it runs the
    tail and puts them back: the caller's ``rate`` is as it was on return).
    """
    n = np.shape(tiles)[0]

    def col(a, dt):
        # a column already as the kernel takes it is passed as it is (the same
        # array broadcast_to and ascontiguousarray would give, ~4 us less per
        # column: a prune round's envelope call takes 14)
        if type(a) is np.ndarray and a.dtype == dt and a.shape == (n,) and a.flags.c_contiguous:
            return a
        return np.ascontiguousarray(np.broadcast_to(a, (n,)), dtype=dt)

    f = lambda a: col(a, np.float64)  # noqa: E731
    i = lambda a: col(a, np.int64)  # noqa: E731
    out = {k: np.empty(n, dtype=np.float64) for k in
           ("latency_us", "t_prologue_us", "t_steady_us", "t_epilogue_us", "t_steady_iter_us")}
    waves = np.empty(n, dtype=np.int64)
    tail = np.empty(n, dtype=np.int64)
    util = np.empty((0 if latency_only else n, N_RES), dtype=np.float64)
    wi = np.ascontiguousarray(work_iter, dtype=np.float64)
    we = np.ascontiguousarray(work_epi, dtype=np.float64)
    if l15_avg is None:
        ai, ae = wi, we
    else:
        ai = wi if l15_avg[0] is work_iter else np.ascontiguousarray(l15_avg[0], dtype=np.float64)
        ae = we if l15_avg[1] is work_epi else np.ascontiguousarray(l15_avg[1], dtype=np.float64)
    rc = np.ascontiguousarray(rate, dtype=np.float64)
    if not rc.flags.writeable:  # the kernel scales a row's tail-wave rates in place
        rc = rc.copy()
    args = (wi, we, rc, SHARED, COMPUTE,
            i(tiles), int(sms), i(p), i(ksteps), i(stages), f(warps_tile), float(warps_full),
            f(lat), f(ovh_iter), f(ovh_tile), i(persistent), f(launch),
            f(1.0 if share_eff is None else share_eff), f(0.0 if sync is None else sync),
            f(0.0 if chain is None else chain), f(1.0 if streams is None else streams),
            np.int64(MODEL_TERMS if terms is None else int(terms)),
            f(0.0 if conv is None else conv), f(0.0 if expose is None else expose), ai, ae, l15_avg is not None,
            f(0.0 if tc_cap is None else tc_cap), f(1.0 if smem_cap is None else smem_cap),
            f(1.0 if cuda_cap is None else cuda_cap), out["latency_us"], out["t_prologue_us"], out["t_steady_us"], out["t_epilogue_us"],
            out["t_steady_iter_us"], waves, tail, util, not latency_only)
    run_shares(_envelopes, args, even_bounds(n))
    out["waves"] = waves
    out["tail_tiles"] = tail
    if not latency_only:
        out["util"] = util
    return out
