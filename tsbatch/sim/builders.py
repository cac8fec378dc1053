"""Tile-graph builders: GEMM in four pipeline organizations, GEMM+SiLU, FlashAttention-3.

Each builder writes the template of one CTA (GTSim Fig. 4-5) with
:class:`~tsbatch.sim.graph.GraphBuilder` and the launch grid in launch order.

Pipelines (``PIPELINES``; GTSim §4.2 Fig. 5, §7):

``naive2``
    No warp specialization: every warp loads and computes. A software
    pipeline ``num_stages`` deep (the Fig. 5 "naive 2-stage" is
    ``num_stages=2``): the loads of iteration ``i + S - 1`` are issued in
    iteration ``i``. This is also the shape of a Triton matmul (``cp.async``
    loads on the LSU when ``use_tma`` is False), whose pipeliner
    (``MatmulLoopPipeline.cpp``, ``createAsyncOps``) allocates ring slots
    for the load distance ``S - 1`` plus one more when the MMA is wgmma:

    * wgmma reads its operands from shared memory until it completes, so
      with ``S`` slots the load of ``i + S - 1`` reuses the slot of
      iteration ``i - 1`` and waits for that MMA (``wgmma.wait(1)``);
    * mma.sync (and FMA) read register fragments loaded from shared memory
      (``ldmatrix``, prefetched one iteration ahead), so ``S - 1`` slots
      suffice: the load of ``i + S - 1`` reuses the slot of iteration ``i``
      once its fragments are in registers.
``ws_coop``
    A producer warp (TMA) and two consumer warp groups that split each output
    tile by rows and run the mainloop together, then their epilogue halves;
    the producer prefetches the next tile during the epilogue.
``ws_pingpong``
    Producer plus two consumer warp groups that each own half of the tile (a
    sub-tile, loaded separately: more TMA traffic) and take turns on the
    tensor cores, so one group's epilogue overlaps the other's mainloop.
``ws3``
    Producer, two cooperative MMA warp groups and a dedicated epilogue warp
    group fed by a data edge from the last MMA: the epilogue of tile ``t``
    overlaps the mainloop of tile ``t + 1`` without extra traffic.

The warp-specialized pipelines are persistent: a CTA processes ``waves``
output tiles along ``n`` (tile ``(cta_m, cta_n * waves + t)``).
"""

from __future__ import annotations

import math

import numpy as np

from tsbatch.errors import InputError
from tsbatch.sim.graph import DTYPE_BYTES, GraphBuilder, Tensor, TileGraph

__all__ = [
    "PIPELINES",
    "fma_layout",
    "fma_smem_bytes",
    "grouped_order",
    "gemm_graph",
    "gemm_silu_graph",
    "flash_attention3_graph",
]

PIPELINES = ("naive2", "ws_coop", "ws_pingpong", "ws3")

#: element operations per output element of the fused SiLU epilogue
#: ``x * sigmoid(x) = x / (1 + exp(-x))``: one ex2 and one rcp on the SFU,
#: and a scale, an add, a multiply and the fp32 -> fp16 convert on CUDA cores.
SILU_SFU_OPS = 2
SILU_ALU_OPS = 4
#: CUDA-core ops per output element of the plain epilogue (convert + pack)
EPI_ALU_OPS = 1
#: cycles of a CTA-wide barrier / mbarrier wait round trip (sync node delay)
BARRIER_CLK = 20.0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grouped_order(num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[np.ndarray, np.ndarray]:
    """Tile coordinates in launch order for Triton's grouped ("super-grouping") order.

    ``group_m <= 1`` is row-major order.
    """
    pid = np.arange(num_pid_m * num_pid_n, dtype=np.int64)
    g = max(int(group_m), 1)
    in_group = g * num_pid_n
    group_id = pid // in_group
    first_m = group_id * g
    size_m = np.minimum(num_pid_m - first_m, g)
    pid_m = first_m + (pid % size_m)
    pid_n = (pid % in_group) // size_m
    return pid_m.astype(np.int32), pid_n.astype(np.int32)


def _check_pos(**kw) -> None:
    for k, v in kw.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise InputError(f"{k} must be a positive integer, got {v!r}")


def _dtypes(dtype: str, tf32: bool) -> tuple[str, str, str]:
    """(storage dtype, mma dtype, mma kind override or '')."""
    if dtype == "float32":
        return ("float32", "tf32", "") if tf32 else ("float32", "float32", "fma")
    if dtype in ("float16", "bfloat16", "float8"):
        return dtype, dtype, ""
    raise InputError(f"dtype must be float16, bfloat16, float32 or float8, got {dtype!r}")


def gemm_graph(
    m: int,
    n: int,
    k: int,
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    num_stages: int = 2,
    num_warps: int = 4,
    group_m: int = 8,
    dtype: str = "float16",
    tf32: bool = False,
    pipeline: str = "naive2",
    epilogue: str = "none",
    use_tma: bool | None = None,
    mma_kind: str | None = None,
    waves: int = 1,
    a_row_major: bool = True,
    b_row_major: bool = True,
    mma_async: bool = True,
    k_iters: int | None = None,
) -> TileGraph:
    """Tile graph of ``C[m, n] = epilogue(A[m, k] @ B[k, n])``.

    Parameters
    ----------
    m, n, k : int
        Problem size.
    block_m, block_n, block_k, num_stages, num_warps, group_m : int
        Tile configuration (the candidate columns).
    dtype : str
        Input/output dtype; ``float32`` runs on tensor cores as TF32 when
        ``tf32`` else on CUDA cores.
    pipeline : str
        One of :data:`PIPELINES`.
    epilogue : {"none", "silu"}
    use_tma : bool, optional
        Bulk TMA loads/stores (default: True for the warp-specialized
        pipelines, False for ``naive2``, i.e. ``cp.async`` like Triton).
    mma_kind : str, optional
        ``warpgroup`` (wgmma), ``warp`` (mma.sync) or ``fma``; default
        ``warpgroup`` for warp-specialized pipelines, for ``naive2`` the
        caller decides (see :func:`tsbatch.sim.api.triton_mma_kind`).
    waves : int
        Output tiles per CTA (persistent kernel; the grid shrinks accordingly).
    mma_async : bool
        ``naive2`` with wgmma: keep one MMA in flight (``wgmma.wait(1)``, as
        Triton does) instead of waiting for each MMA before issuing the next
        loads (``wait(0)``: the Fig. 5 naive kernel).
    k_iters : int, optional
        Build only the first ``k_iters`` iterations of the reduction loop
        (the tensors keep their full extent, so addresses are those of the
        whole kernel). For K sampling (:func:`tsbatch.sim.api.simulate_config`);
        default: all ``ceil(k / block_k)``.

    Returns
    -------
    TileGraph
    """
    _check_pos(m=m, n=n, k=k, block_m=block_m, block_n=block_n, block_k=block_k,
               num_stages=num_stages, num_warps=num_warps, group_m=group_m, waves=waves)
    if pipeline not in PIPELINES:
        raise InputError(f"pipeline must be one of {', '.join(PIPELINES)}, got {pipeline!r}")
    if epilogue not in ("none", "silu"):
        raise InputError(f"epilogue must be 'none' or 'silu', got {epilogue!r}")
    st_dtype, mma_dtype, kind_override = _dtypes(dtype, tf32)
    kind = kind_override or mma_kind or "warpgroup"
    iters = _cdiv(k, block_k)
    if k_iters is not None:
        _check_pos(k_iters=k_iters)
        iters = min(iters, int(k_iters))
    if pipeline == "naive2":
        return _gemm_naive(m, n, k, block_m, block_n, block_k, num_stages, num_warps, group_m,
                           st_dtype, mma_dtype, kind, epilogue, bool(use_tma), waves,
                           a_row_major, b_row_major, mma_async, iters)
    if pipeline in ("ws_coop", "ws_pingpong", "ws3") and block_m % 2:
        raise InputError(f"block_m must be even for {pipeline}, got {block_m}")
    return _gemm_ws(m, n, k, block_m, block_n, block_k, num_stages, group_m, st_dtype, mma_dtype,
                    kind, epilogue, pipeline, True if use_tma is None else bool(use_tma), waves,
                    a_row_major, b_row_major, iters)


def gemm_silu_graph(m: int, n: int, k: int, **kw) -> TileGraph:
    """GEMM with the fused SiLU epilogue (GTSim §6-7)."""
    kw["epilogue"] = "silu"
    return gemm_graph(m, n, k, **kw)


def _grid(m, n, block_m, block_n, group_m, waves):
    pm = _cdiv(m, block_m)
    pn = _cdiv(_cdiv(n, block_n), waves)
    return grouped_order(pm, pn, group_m)


def _epilogue(g: GraphBuilder, src: int, *, rows: int, cols: int, warps, group: int,
              epilogue: str, store_op: str, coord, dtype_bytes: int, label: str,
              tile_rows: int, last_store: int | None) -> tuple[int, int]:
    """Epilogue chain after ``src`` (last MMA); returns (first node, store node)."""
    elems = rows * cols
    first = None
    prev = src
    if epilogue == "silu":
        s = g.node("sfu", warps=warps, group=group, work=SILU_SFU_OPS * elems, label=f"{label}.silu_sfu")
        g.data(prev, s)
        first = s
        a = g.node("alu", warps=warps, group=group, work=SILU_ALU_OPS * elems, label=f"{label}.silu_alu")
        g.data(s, a)
        prev = a
    else:
        a = g.node("alu", warps=warps, group=group, work=EPI_ALU_OPS * elems, label=f"{label}.cvt")
        g.data(prev, a)
        first = a
        prev = a
    if store_op == "tma_store":
        sm = g.node("smem", warps=warps, group=group, work=elems * dtype_bytes, label=f"{label}.st_smem")
        g.data(prev, sm)
        if last_store is not None:
            g.data(last_store, sm)  # staging buffer reused after the previous TMA store read it
        st = g.node("tma_store", warps=(warps[0], 1), group=group, tensor="C", tile=(tile_rows, cols),
                    coord=coord, label=f"{label}.tma_store")
        g.data(sm, st)
    else:
        st = g.node("stg", warps=warps, group=group, tensor="C", tile=(tile_rows, cols), coord=coord,
                    label=f"{label}.stg")
        g.data(prev, st)
    return first, st


def _tensors(g, m, n, k, st_dtype, a_row_major, b_row_major):
    g.tensor(Tensor("A", m, k, st_dtype, a_row_major))
    g.tensor(Tensor("B", k, n, st_dtype, b_row_major))
    g.tensor(Tensor("C", m, n, st_dtype, True))


def _regs(block_m, block_n, block_k, warps, eb, kind):
    acc = block_m * block_n // (32 * warps)
    frag = 0 if kind == "warpgroup" else (block_m + block_n) * block_k * eb // 4 // (32 * warps)
    return int(min(255, acc + frag + 32))


def fma_layout(bm: int, bn: int, warps: int) -> tuple[int, int, int, int, int]:
    """Triton's FMA-dot accumulator layout of a ``bm x bn`` tile (IEEE FP32 ``tl.dot``).

    The row-major store's blocked layout: 4 consecutive columns a thread
    (16 bytes), ``tn = min(32, bn / 4)`` lanes along N, the rest of the warp
    along M, warps along N while columns remain, then M. Returns
    ``(sn, tn, tm, reps_m, reps_n)``: columns per thread group, lanes along N
    and M, and the rows and column groups each thread holds.
    """
    sn = 4 if bn >= 4 else bn
    tn = min(max(bn // sn, 1), 32)
    tm = 32 // tn
    wn = min(max(bn // (sn * tn), 1), warps)
    wm = max(warps // wn, 1)
    reps_n = max(bn // (sn * tn * wn), 1)
    reps_m = max(bm // (tm * wm), 1)
    return sn, tn, tm, reps_m, reps_n


def fma_smem_bytes(bm: int, bn: int, bk: int, warps: int, a_row_major: bool, b_row_major: bool) -> float:
    """Shared-memory traffic of one iteration of Triton's FMA dot, in bytes of
    128-byte wavefronts (a bank-conflicting access replays as more wavefronts).

    Notes
    -----
    An FMA-dot operand (blocked parent layout) is staged in shared memory
    unswizzled, in the order of its global load (``SwizzledSharedEncodingAttr``
    with vec = perPhase = maxPhase = 1 when the parent is not an MMA layout),
    and each thread reads its rows of A and columns of B (:func:`fma_layout`)
    for every k, 16-byte vectors along the contiguous dimension:

    * B row-major (N contiguous): a warp reads ``tn x 16`` consecutive bytes
      per column group and k: ``ceil(tn * 16 / 128)`` wavefronts;
    * B column-major (K contiguous): a column is a 16-byte vector of four k;
      the ``tn`` columns of a warp lie ``bk`` words apart, in one bank group,
      so they replay: ``tn`` wavefronts per column group and four k;
    * A row-major (K contiguous): the warp's ``tm`` rows likewise, per four k;
    * A column-major (M contiguous): a row's value is a broadcast, one
      wavefront per row and k.

    The same rule as the analytical lowering (``kernels_catalog/gemm.py``),
    written here so that the simulator does not import the model it checks.
    """
    sn, tn, tm, reps_m, reps_n = fma_layout(bm, bn, warps)
    b_wf = reps_n * float(-(-(tn * sn * 4) // 128)) if b_row_major else reps_n * sn * tn / 4.0
    a_wf = reps_m * tm / 4.0 if a_row_major else float(reps_m)
    return 128.0 * bk * warps * (a_wf + b_wf)


def _gemm_naive(m, n, k, bm, bn, bk, stages, warps, group_m, st_dtype, mma_dtype, kind, epilogue,
                use_tma, waves, a_rm, b_rm, mma_async, iters):
    eb = DTYPE_BYTES[st_dtype]
    g = GraphBuilder(f"gemm_naive{stages}_{m}x{n}x{k}_{bm}x{bn}x{bk}")
    _tensors(g, m, n, k, st_dtype, a_rm, b_rm)
    allw = (0, warps)
    ld_op = "tma_load" if use_tma else "ldg"
    ld_warps = (0, 1) if use_tma else allw
    store_op = "tma_store" if use_tma else "stg"
    last_store = None
    prev_tail = None  # last node issued by the CTA in program order (previous tile)
    mma_prev = None
    for t in range(waves):
        loads = {}
        mdone = {}

        def issue_load(i, after):
            la = g.node(ld_op, warps=ld_warps, tensor="A", tile=(bm, bk), coord=(0, 1, 0, i, 0, 0),
                        label=f"t{t}.ldA{i}")
            lb = g.node(ld_op, warps=ld_warps, tensor="B", tile=(bk, bn),
                        coord=(i, 0, 0, t, 0, waves), label=f"t{t}.ldB{i}")
            if after is not None:
                g.order(after, la)
            g.order(la, lb)
            loads[i] = (la, lb)
            return lb

        tail = prev_tail
        free = {}
        for i in range(min(stages - 1, iters)):
            tail = issue_load(i, tail)
        for i in range(iters):
            if i not in loads:
                tail = issue_load(i, tail)
            w = g.node("sync", warps=allw, work=BARRIER_CLK, label=f"t{t}.wait{i}")
            g.data(loads[i][0], w)
            g.data(loads[i][1], w)
            g.order(tail, w)
            src = w
            if kind != "warpgroup":
                # mma.sync reads register fragments loaded from shared memory (ldmatrix),
                # Triton's FMA dot its rows of A and columns of B (fma_smem_bytes)
                if kind == "fma":
                    fbytes = fma_smem_bytes(bm, bn, bk, warps, a_rm, b_rm)
                else:
                    wm = max(1, int(round(math.sqrt(warps))))
                    wn = max(1, warps // wm)
                    fbytes = (bm * bk * wn + bk * bn * wm) * eb
                frag = g.node("smem", warps=allw, work=fbytes, label=f"t{t}.frag{i}")
                g.data(w, frag)
                src = frag
            mm = g.node("mma", warps=allw, work=2.0 * bm * bn * bk, label=f"t{t}.mma{i}")
            g.data(src, mm)
            if mma_prev is not None:
                g.order(mma_prev, mm)
            mma_prev = mm
            if kind != "warpgroup":
                free[i] = src          # the slot is free once its fragments are in registers
                tail = mm
                mdone[i] = mm
            else:
                d = g.node("sync", warps=allw, label=f"t{t}.mdone{i}")
                g.data(mm, d)
                free[i] = d            # wgmma reads shared memory until it completes
                mdone[i] = d
                tail = mm if mma_async else d
            j = i + stages - 1
            if stages > 1 and j < iters:
                lb = issue_load(j, tail)
                # ring slot reuse: S slots for wgmma (slot of i - 1), S - 1 for fragments (slot of i)
                reuse = i - 1 if kind == "warpgroup" else i
                if reuse >= 0:
                    g.data(free[reuse], loads[j][0])
                    g.data(free[reuse], lb)
                tail = lb
        first, st = _epilogue(g, mdone[iters - 1], rows=bm, cols=bn, warps=allw, group=0,
                              epilogue=epilogue, store_op=store_op, coord=(0, 1, 0, t, 0, waves),
                              dtype_bytes=eb, label=f"t{t}", tile_rows=bm, last_store=last_store)
        g.order(tail, first)
        last_store = st
        prev_tail = st
    cm, cn = _grid(m, n, bm, bn, group_m, waves)
    slots = stages if kind == "warpgroup" else max(stages - 1, 1)
    smem = slots * (bm * bk + bk * bn) * eb + (bm * bn * eb if use_tma else 0)
    return g.build(cta_m=cm, cta_n=cn, warps_per_cta=warps, smem_bytes_per_cta=smem,
                   regs_per_thread=_regs(bm, bn, bk, warps, eb, kind), mma_dtype=mma_dtype,
                   mma_kind=kind)


def _gemm_ws(m, n, k, bm, bn, bk, stages, group_m, st_dtype, mma_dtype, kind, epilogue, pipeline,
             use_tma, waves, a_rm, b_rm, iters):
    eb = DTYPE_BYTES[st_dtype]
    g = GraphBuilder(f"gemm_{pipeline}_{m}x{n}x{k}_{bm}x{bn}x{bk}")
    _tensors(g, m, n, k, st_dtype, a_rm, b_rm)
    ld_op = "tma_load" if use_tma else "ldg"
    store_op = "tma_store" if use_tma else "stg"
    producer = (0, 1)
    cons = [(4, 4), (8, 4)]
    epi_wg = (12, 4)
    warps = 16 if pipeline == "ws3" else 12
    half = bm // 2
    # producer load sequence: (label, A rows tile, A row coefficient, row block size, B col tile)
    seq = []
    for t in range(waves):
        if pipeline == "ws_pingpong":
            for c in range(2):
                for i in range(iters):
                    seq.append((t, c, i))
        else:
            for i in range(iters):
                seq.append((t, -1, i))
    full = []
    load_nodes = []
    empty = [None] * len(seq)
    prev_ld = None
    for j, (t, c, i) in enumerate(seq):
        if c < 0:
            la = g.node(ld_op, warps=producer, group=0, tensor="A", tile=(bm, bk),
                        coord=(0, 1, 0, i, 0, 0), label=f"t{t}.ldA{i}")
        else:
            # sub-tile c of rows: row tile index in units of bm/2 = 2*cta_m + c
            la = g.node(ld_op, warps=producer, group=0, tensor="A", tile=(half, bk),
                        coord=(c, 2, 0, i, 0, 0), label=f"t{t}.c{c}.ldA{i}")
        lb = g.node(ld_op, warps=producer, group=0, tensor="B", tile=(bk, bn),
                    coord=(i, 0, 0, t, 0, waves), label=f"t{t}.ldB{i}" + (f".c{c}" if c >= 0 else ""))
        if prev_ld is not None:
            g.order(prev_ld, la)
        g.order(la, lb)
        prev_ld = lb
        f = g.node("sync", warps=producer, group=0, work=BARRIER_CLK, label=f"full{j}")
        g.data(la, f)
        g.data(lb, f)
        full.append(f)
        load_nodes.append(la)

    def release(j, srcs):
        e = g.node("sync", warps=producer, group=0, label=f"empty{j}")
        for s_ in srcs:
            g.data(s_, e)
        empty[j] = e
        if j + stages < len(seq):
            g.order(e, load_nodes[j + stages])

    last = [None, None]   # last node in program order per consumer
    last_store = [None, None]
    epi_last = None
    epi_store = None
    if pipeline in ("ws_coop", "ws3"):
        for t in range(waves):
            jbase = t * iters
            mm_last = [None, None]
            for i in range(iters):
                j = jbase + i
                mms = []
                for c in range(2):
                    mm = g.node("mma", warps=cons[c], group=1 + c, work=2.0 * half * bn * bk,
                                label=f"t{t}.c{c}.mma{i}")
                    g.data(full[j], mm)
                    if last[c] is not None:
                        g.order(last[c], mm)
                    last[c] = mm
                    mm_last[c] = mm
                    mms.append(mm)
                release(j, mms)
            if pipeline == "ws_coop":
                for c in range(2):
                    first, st = _epilogue(g, mm_last[c], rows=half, cols=bn, warps=cons[c], group=1 + c,
                                          epilogue=epilogue, store_op=store_op,
                                          coord=(c, 2, 0, t, 0, waves), dtype_bytes=eb,
                                          label=f"t{t}.c{c}", tile_rows=half, last_store=last_store[c])
                    g.order(last[c], first)
                    last_store[c] = st
                    last[c] = st
            else:
                first, st = _epilogue(g, mm_last[0], rows=bm, cols=bn, warps=epi_wg, group=3,
                                      epilogue=epilogue, store_op=store_op, coord=(0, 1, 0, t, 0, waves),
                                      dtype_bytes=eb, label=f"t{t}.epi", tile_rows=bm, last_store=epi_store)
                g.data(mm_last[1], first)
                if epi_last is not None:
                    g.order(epi_last, first)
                epi_last = st
                epi_store = st
    else:  # ping-pong
        turn_done = None
        j = 0
        for t in range(waves):
            for c in range(2):
                mm_prev = None
                for i in range(iters):
                    mm = g.node("mma", warps=cons[c], group=1 + c, work=2.0 * half * bn * bk,
                                label=f"t{t}.c{c}.mma{i}")
                    g.data(full[j], mm)
                    if last[c] is not None:
                        g.order(last[c], mm)
                    if i == 0 and turn_done is not None:
                        g.order(turn_done, mm)  # ordered math barrier: wait for the other group's mainloop
                    last[c] = mm
                    mm_prev = mm
                    release(j, [mm])
                    j += 1
                done = g.node("sync", warps=cons[c], group=1 + c, label=f"t{t}.c{c}.turn")
                g.data(mm_prev, done)
                turn_done = done
                first, st = _epilogue(g, mm_prev, rows=half, cols=bn, warps=cons[c], group=1 + c,
                                      epilogue=epilogue, store_op=store_op, coord=(c, 2, 0, t, 0, waves),
                                      dtype_bytes=eb, label=f"t{t}.c{c}", tile_rows=half,
                                      last_store=last_store[c])
                g.order(done, first)
                last_store[c] = st
                last[c] = st
    cm, cn = _grid(m, n, bm, bn, group_m, waves)
    smem = stages * (bm * bk + bk * bn) * eb + bm * bn * eb
    return g.build(cta_m=cm, cta_n=cn, warps_per_cta=warps, smem_bytes_per_cta=smem,
                   regs_per_thread=min(255, bm * bn // (32 * 8) + 32), mma_dtype=mma_dtype, mma_kind=kind)


def flash_attention3_graph(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int = 128,
    *,
    block_m: int = 128,
    block_n: int = 128,
    num_stages: int = 2,
    dtype: str = "float16",
) -> TileGraph:
    """FlashAttention-3 forward (non-causal) as a warp-specialized tile graph.

    One CTA per (query block, batch x head). A producer warp streams K and V
    tiles by TMA through ``num_stages`` slots; two consumer warp groups each
    own ``block_m / 2`` query rows and, per KV block, run ``S = Q K^T``
    (wgmma), the online softmax (exp on the SFU, max/sum/rescale on CUDA
    cores) and ``O += P V`` (wgmma). The K slot is released after both
    groups' ``S``, the V slot after both groups' ``P V``. The epilogue
    normalizes ``O`` and stores it by TMA.

    Notes
    -----
    GTSim §6 (attention kernels). FA3's inter-warpgroup ping-pong is the
    order edge ``S(1, j)`` after ``S(0, j)``.
    """
    _check_pos(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, block_m=block_m,
               block_n=block_n, num_stages=num_stages)
    if dtype not in ("float16", "bfloat16", "float8"):
        raise InputError(f"dtype must be float16, bfloat16 or float8, got {dtype!r}")
    if seq_len % block_m or seq_len % block_n or block_m % 2:
        raise InputError(f"seq_len {seq_len} must be a multiple of block_m {block_m} and block_n {block_n}")
    eb = DTYPE_BYTES[dtype]
    bh = batch * heads
    rows = bh * seq_len
    g = GraphBuilder(f"fa3_b{batch}_h{heads}_s{seq_len}_d{head_dim}")
    for name in ("Q", "K", "V", "O"):
        g.tensor(Tensor(name, rows, head_dim, dtype, True))
    nb_m = seq_len // block_m
    nb_n = seq_len // block_n
    half = block_m // 2
    producer = (0, 1)
    cons = [(4, 4), (8, 4)]
    q = []
    for c in range(2):
        lq = g.node("tma_load", warps=producer, tensor="Q", tile=(half, head_dim),
                    coord=(c, 2, 2 * nb_m, 0, 0, 0), label=f"ldQ{c}")
        q.append(lq)
    g.order(q[0], q[1])
    prev = q[1]
    kv = []
    for j in range(nb_n):
        lk = g.node("tma_load", warps=producer, tensor="K", tile=(block_n, head_dim),
                    coord=(j, 0, nb_n, 0, 0, 0), label=f"ldK{j}")
        lv = g.node("tma_load", warps=producer, tensor="V", tile=(block_n, head_dim),
                    coord=(j, 0, nb_n, 0, 0, 0), label=f"ldV{j}")
        g.order(prev, lk)
        g.order(lk, lv)
        prev = lv
        kv.append((lk, lv))
    last = [None, None]
    s_nodes = {}
    o_nodes = {}
    for j in range(nb_n):
        lk, lv = kv[j]
        for c in range(2):
            s = g.node("mma", warps=cons[c], group=1 + c, work=2.0 * half * block_n * head_dim,
                       label=f"c{c}.S{j}")
            g.data(lk, s)
            g.data(q[c], s)
            if last[c] is not None:
                g.order(last[c], s)
            if c == 1:
                g.order(s_nodes[(0, j)], s)
            sx = g.node("sfu", warps=cons[c], group=1 + c, work=half * block_n, label=f"c{c}.exp{j}")
            g.data(s, sx)
            sa = g.node("alu", warps=cons[c], group=1 + c, work=4 * half * block_n + half * head_dim,
                        label=f"c{c}.softmax{j}")
            g.data(sx, sa)
            o = g.node("mma", warps=cons[c], group=1 + c, work=2.0 * half * head_dim * block_n,
                       label=f"c{c}.PV{j}")
            g.data(sa, o)
            g.data(lv, o)
            last[c] = o
            s_nodes[(c, j)] = s
            o_nodes[(c, j)] = o
        ek = g.node("sync", warps=producer, label=f"emptyK{j}")
        g.data(s_nodes[(0, j)], ek)
        g.data(s_nodes[(1, j)], ek)
        ev = g.node("sync", warps=producer, label=f"emptyV{j}")
        g.data(o_nodes[(0, j)], ev)
        g.data(o_nodes[(1, j)], ev)
        if j + num_stages < nb_n:
            g.order(ek, kv[j + num_stages][0])
            g.order(ev, kv[j + num_stages][1])
    for c in range(2):
        nrm = g.node("alu", warps=cons[c], group=1 + c, work=2 * half * head_dim, label=f"c{c}.normalize")
        g.data(last[c], nrm)
        sm = g.node("smem", warps=cons[c], group=1 + c, work=half * head_dim * eb, label=f"c{c}.st_smem")
        g.data(nrm, sm)
        st = g.node("tma_store", warps=(cons[c][0], 1), group=1 + c, tensor="O", tile=(half, head_dim),
                    coord=(c, 2, 2 * nb_m, 0, 0, 0), label=f"c{c}.stO")
        g.data(sm, st)
    cm = np.tile(np.arange(nb_m, dtype=np.int32), bh)
    cn = np.repeat(np.arange(bh, dtype=np.int32), nb_m)
    smem = (block_m * head_dim + 2 * num_stages * block_n * head_dim) * eb
    return g.build(cta_m=cm, cta_n=cn, warps_per_cta=12, smem_bytes_per_cta=smem, regs_per_thread=168,
                   mma_dtype=dtype, mma_kind="warpgroup")
