"""Fused compute–communication families: AllGather+GEMM, GEMM+ReduceScatter, Ulysses attention.

TileSight §3.6: a tensor- or sequence-parallel mapping partitions a tile
grid and its tensors over GPUs; a tile that needs a tensor tile placed on
another GPU gains a remote access, realised as a collective, whose α–β cost
(:mod:`tsbatch.collectives`) overlaps the local compute through the
prologue–steady–epilogue envelope. Here the remote accesses are *inferred*
from the placement (:func:`infer_remote_accesses`: which GEMM operand is
sharded along which dimension), never written per family, and the work is
cut into ``chunks`` along the output rows so that the communication of one
chunk overlaps the compute of another:

- ``ag_gemm`` (sequence-parallel column-linear): ``A[m, k]`` sharded by rows,
  ``B[k, n]`` by columns; every rank needs all of A, so A is all-gathered,
  chunk by chunk, before the local GEMM ``m x n/tp x k`` consumes it.
  Envelope (communication leads): ``T = comm_1 + (c - 1) max(gemm_c, comm_c) + gemm_c``.
- ``gemm_rs`` (row-linear): ``A[m, k]`` and ``B[k, n]`` both sharded along
  ``k``; the local GEMM ``m x n x k/tp`` yields a partial ``C`` that is
  reduce-scattered by rows, chunk by chunk.
  Envelope (compute leads): ``T = gemm_1 + (c - 1) max(gemm_c, comm_c) + comm_c``.
- ``ulysses`` (DeepSpeed-Ulysses sequence parallelism): Q, K, V sharded by
  sequence are re-sharded by heads with all-to-alls, attention runs on
  ``heads / sp`` heads over the whole sequence, and an all-to-all returns O
  to sequence sharding; chunked over heads (the all-to-alls of one head
  group overlap the attention of another).
- ``moe_ep`` (expert parallelism): tokens sharded by data parallelism, experts
  over the same group (:func:`infer_moe_accesses`): an all-to-all dispatches
  every routed token to its expert's owner, the rank's experts run their two
  GEMMs (``hidden -> ffn -> hidden``) on the tokens they receive (uniform
  routing: ``tokens x GPUs x top_k / experts`` rows each, back to back as a
  grouped GEMM does), and an all-to-all combines; chunked over tokens.

Contention: while a chunk's collective runs, its NCCL channels occupy one SM
each, so an overlapped GEMM or attention chunk runs on ``SMs - channels``
SMs: its time is scaled by ``SMs / (SMs - channels)`` in the steady state
(the first compute chunk of ``gemm_rs`` and the last of ``ag_gemm`` run
alone). Memory-bandwidth contention is not modelled.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

from kernels_catalog.base import Column, Family
from tsbatch.errors import InputError
from tsbatch.kernels._threads import num_threads

__all__ = ["AG_GEMM", "GEMM_RS", "ULYSSES", "MOE_EP", "FAMILIES", "infer_remote_accesses",
           "infer_moe_accesses", "evaluate_fused",
           "RESULT_COLUMNS", "ELEM_BYTES"]

ELEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8": 1}
_OUT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8": 2}

RESULT_COLUMNS = ("latency_us", "feasible", "infeasible_reason", "compute_us", "comm_us",
                  "chunk_compute_us", "chunk_comm_us", "exposed_comm_us", "overlap_pct",
                  "comm_collective", "chunk_comm_bytes", "comm_algorithm", "comm_protocol", "comm_bottleneck_link")


# ------------------------------------------------------------------ placement
def infer_remote_accesses(a_shard: str | None, b_shard: str | None, out_shard: str | None) -> list[dict]:
    """Remote tensor accesses of a tensor-parallel GEMM ``C[m,n] = A[m,k] @ B[k,n]``.

    Each operand is sharded along one of its dimensions (or replicated:
    ``None``) over the TP group. The rule is producer–consumer placement:

    - A and B both sharded along ``k``: every rank owns a partial sum of all of
      C, which must be reduced: a ``reduce_scatter`` (C sharded by ``m``) or an
      ``all_reduce`` (C replicated), after the GEMM, of ``m n`` output elements;
    - A sharded along ``m`` while B is sharded along ``n`` (or replicated with C
      replicated): the local GEMM needs every row of A: an ``all_gather`` of A
      (``m k`` elements) before the GEMM;
    - A sharded along ``m`` with B replicated and C sharded by ``m``: local.

    Returns dicts ``{collective, tensor, when: "before"|"after", elements: (dims)}``
    and the local GEMM's divided dimensions under key ``"local"``.
    """
    acc: list[dict] = []
    local = {"m": False, "n": False, "k": False}  # dims divided by tp in the local GEMM
    if a_shard == "k" and b_shard == "k":
        local["k"] = True
        coll = "reduce_scatter" if out_shard == "m" else "all_reduce"
        acc.append({"collective": coll, "tensor": "C", "when": "after", "elements": ("m", "n")})
    elif a_shard == "m":
        if b_shard == "n" or out_shard is None:
            acc.append({"collective": "all_gather", "tensor": "A", "when": "before", "elements": ("m", "k")})
            if b_shard == "n":
                local["n"] = True
        else:
            local["m"] = True
    elif b_shard == "n":
        local["n"] = True
    else:
        raise InputError(f"unsupported GEMM placement A:{a_shard} B:{b_shard} C:{out_shard}")
    return acc + [{"local": local}]


#: placements of the two GEMM families (A shard, B shard, C shard)
PLACEMENT = {"ag_gemm": ("m", "n", "n"), "gemm_rs": ("k", "k", "m")}


# ------------------------------------------------------------------ columns
_COMMON = (
    Column("system", "str", "hw/systems file stem or alias"),
    Column("num_gpus", "int", "tensor/sequence-parallel degree (GPUs)", positive=True),
    Column("gpus_per_node", "int", "GPUs per node (default: the system's, up to num_gpus)",
           required=False, positive=True),
    Column("chunks", "int", "communication chunks overlapped with compute (1: none)",
           required=False, default=1, positive=True),
    Column("algorithm", "str", "force the collective's algorithm", required=False),
    Column("protocol", "str", "force the collective's protocol", required=False),
)
_GEMM_COLS = (
    Column("m", "int", "rows of A and C (global)", positive=True),
    Column("n", "int", "columns of B and C (global)", positive=True),
    Column("k", "int", "reduction length (global)", positive=True),
    Column("dtype", "str", "input element type", choices=tuple(ELEM_BYTES)),
    Column("block_m", "int", "GEMM tile rows", positive=True),
    Column("block_n", "int", "GEMM tile columns", positive=True),
    Column("block_k", "int", "GEMM reduction step", positive=True),
    Column("num_stages", "int", "GEMM pipeline stages", positive=True),
    Column("num_warps", "int", "GEMM warps per block", positive=True),
)
_ATTN_COLS = (
    Column("batch", "int", "batch", positive=True),
    Column("heads", "int", "query heads (global)", positive=True),
    Column("seq_len", "int", "sequence length (global)", positive=True),
    Column("head_dim", "int", "head dimension", positive=True),
    Column("dtype", "str", "element type", choices=("float16", "bfloat16")),
    Column("block_m", "int", "attention query tile", positive=True),
    Column("block_n", "int", "attention key tile", positive=True),
    Column("num_stages", "int", "pipeline stages", positive=True),
    Column("num_warps", "int", "warps per block", positive=True),
    Column("causal", "bool", "causal mask", required=False, default=False),
)


_MOE_COLS = (
    Column("tokens", "int", "tokens per rank (data-parallel shard of the batch)", positive=True),
    Column("hidden", "int", "model dimension", positive=True),
    Column("ffn", "int", "expert FFN dimension", positive=True),
    Column("experts", "int", "experts (global), sharded over the EP group", positive=True),
    Column("top_k", "int", "experts per token", positive=True),
    Column("dtype", "str", "element type", choices=tuple(ELEM_BYTES)),
    Column("block_m", "int", "expert GEMM tile rows", positive=True),
    Column("block_n", "int", "expert GEMM tile columns", positive=True),
    Column("block_k", "int", "expert GEMM reduction step", positive=True),
    Column("num_stages", "int", "GEMM pipeline stages", positive=True),
    Column("num_warps", "int", "GEMM warps per block", positive=True),
)


def infer_moe_accesses(token_shard: str, expert_shard: str) -> list[dict]:
    """Remote accesses of an MoE layer from placement: tokens sharded by data
    parallelism (``"dp"``) while experts are sharded over the same group (``"ep"``)
    send every routed token to its expert's owner and back: an all-to-all before
    (dispatch) and one after (combine) the expert GEMMs; experts replicated
    (``None``) need none."""
    if expert_shard is None:
        return []
    if token_shard != "dp" or expert_shard != "ep":
        raise InputError(f"unsupported MoE placement tokens:{token_shard} experts:{expert_shard}")
    return [{"collective": "all_to_all", "tensor": "X", "when": "before", "elements": ("tokens", "top_k", "hidden")},
            {"collective": "all_to_all", "tensor": "Y", "when": "after", "elements": ("tokens", "top_k", "hidden")}]


def _empty_shard(column: str) -> str:
    """The reason of a row whose ``column`` is split over more GPUs than it has elements."""
    return (f"{column} is smaller than num_gpus (the TP degree): sharding {column} over the "
            f"GPUs leaves {column} = 0 per GPU")


#: the reason of a row whose chunk of communication has more bytes than int64 holds
BYTES_TOO_LARGE = "sizes too large: a chunk's communication bytes exceed int64 (2^63)"


class _Reasons:
    """Each row's first infeasibility reason, as a code into a list of texts (0: none):
    no Python string per row until the result's column, gathered by code."""

    def __init__(self, n: int):
        self.code = np.zeros(n, dtype=np.int64)
        self.texts: list = [None]

    def none(self) -> np.ndarray:
        """Rows with no reason yet."""
        return self.code == 0

    def set(self, mask: np.ndarray, text: str) -> None:
        """``text`` for the rows of ``mask`` that have no reason yet."""
        hit = np.asarray(mask, dtype=bool) & (self.code == 0)
        if hit.any():
            if text not in self.texts:
                self.texts.append(text)
            self.code[hit] = self.texts.index(text)

    def series(self) -> pl.Series:
        return pl.Series(self.texts, dtype=pl.String).gather(self.code)


def _as_bytes(x: np.ndarray, reasons: _Reasons) -> np.ndarray:
    """Byte counts ``x`` (float64) as int64; a row beyond int64 gets the reason
    :data:`BYTES_TOO_LARGE` (if it has none) and 1 byte, never a wrapped cast."""
    big = ~(np.asarray(x, dtype=np.float64) < 2.0 ** 63)
    reasons.set(big, BYTES_TOO_LARGE)
    return np.where(big, 1.0, x).astype(np.int64)


def _need(df: pl.DataFrame, cols, family: str) -> pl.DataFrame:
    """``df`` with the optional columns it lacks at their defaults; an error for a
    missing required column or a non-positive value in a positive one (the columns'
    minima in one pass). ``dtype`` is checked by :func:`_dtype_codes`."""
    positive = []
    for c in cols:
        if c.name not in df.columns:
            if c.required:
                raise InputError(f"{family} candidates: missing column '{c.name}'")
            if c.default is not None:
                df = df.with_columns(pl.lit(c.default).alias(c.name))
        elif c.positive and df.schema[c.name].is_numeric():
            positive.append(c.name)
    if positive and df.height:
        low = df.select([pl.col(x).min() for x in positive]).row(0)
        for x, v in zip(positive, low):
            if v is not None and v <= 0:
                raise InputError(f"{family} candidates: column '{x}' must be positive")
    return df


def _repeat(text: str, n: int) -> pl.Series:
    """A String series of ``n`` copies of ``text``."""
    return pl.Series("", [text], dtype=pl.String).new_from_index(0, n) if n else pl.Series("", [], dtype=pl.String)


def _system_codes(systems) -> tuple[list, np.ndarray]:
    """(distinct systems in order of first appearance, each row's index into them);
    ``systems`` a String series or an array of names."""
    ser = systems if isinstance(systems, pl.Series) else pl.Series(systems, dtype=pl.String)
    n = len(ser)
    if n and ser.null_count() == 0 and (ser == ser[0]).all():  # the usual case: one system
        return [ser[0]], np.zeros(n, dtype=np.int64)
    uniq = ser.unique(maintain_order=True).to_list()
    codes = ser.replace_strict(uniq, list(range(len(uniq))), return_dtype=pl.Int64).to_numpy()
    return uniq, np.asarray(codes, dtype=np.int64)  # zero rows: an empty int64 array


def _dtype_codes(dtype: pl.Series, family: str) -> np.ndarray:
    """Each row's ``dtype`` as its index in :data:`ELEM_BYTES`; an unknown one is an error."""
    text = dtype.cast(pl.String)
    codes = text.replace_strict(list(ELEM_BYTES), list(range(len(ELEM_BYTES))), default=-1,
                                return_dtype=pl.Int64).to_numpy()
    if len(codes) and codes.min() < 0:
        bad = set(text.filter(pl.Series(codes < 0)).unique().to_list())
        raise InputError(f"{family} candidates: column 'dtype' has unknown value(s) "
                         f"{sorted(bad, key=str)}")
    return codes


def _per_dtype(table: dict, codes: np.ndarray) -> np.ndarray:
    """``table[dtype]`` (float64) of each row, from its :func:`_dtype_codes`."""
    return np.array([float(table[d]) for d in ELEM_BYTES], dtype=np.float64)[codes]


def _int_key(frame: pl.DataFrame, names, known: dict) -> list:
    """The columns ``names`` of ``frame`` as int64 arrays, a value per frame row: the
    identity of a compute row's tile columns (``known``: columns already as int64
    codes, as ``dtype`` by :func:`_dtype_codes`; a boolean as 0 / 1, null as False: the
    compute family's default, which its validation fills in)."""
    cols = []
    for c in names:
        if c in known:
            cols.append(np.asarray(known[c], dtype=np.int64))
            continue
        s = frame.get_column(c)
        if s.dtype == pl.Boolean:
            s = s.fill_null(False).cast(pl.Int64)
        cols.append(s.cast(pl.Int64).to_numpy())
    return cols


def _eval_compute(tiles: pl.DataFrame, known: dict, src: np.ndarray, sizes: dict,
                  gcode: np.ndarray, gnames: list, need: np.ndarray, family: str,
                  evaluate) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency_us, feasible, sm_count) of per-chunk compute rows, each distinct row
    evaluated once, one call of the engine's ``evaluate`` per GPU.

    Compute row ``i`` is row ``src[i]`` of ``tiles`` (the family's tile columns; ``known``
    holds those already as int64 codes, see :func:`_int_key`) with the size columns
    ``sizes`` (name -> int64 array, a value per compute row) added, on GPU
    ``gnames[gcode[i]]``. Rows equal in GPU, tile and sizes are one row to the engine (a
    row's prediction depends on that row alone); the distinct rows go to it in order of
    first appearance. A row with ``need`` False (its fused row is infeasible already: its
    compute is never shown) is not evaluated: latency NaN, not feasible."""
    from tsbatch.hw import get_hw
    from tsbatch.kernels.rowhash import dedup_rows

    n = len(src)
    sm = np.array([float(get_hw(g).sm_count) for g in gnames])
    lat = np.full(n, np.nan)
    ok = np.zeros(n, dtype=bool)
    rows = np.nonzero(need)[0] if not need.all() else np.arange(n)
    if len(rows) == 0:
        return lat, ok, sm[gcode]
    tsrc = src[rows]
    parts = [gcode[rows], *[x[tsrc] for x in _int_key(tiles, tiles.columns, known)],
             *[np.asarray(v, dtype=np.int64)[rows] for v in sizes.values()]]
    # a column equal in every row tells no rows apart: the key holds the others
    key = np.column_stack([p for p in parts if len(p) and p.min() != p.max()] or [parts[0]])
    inv, rep = dedup_rows(key)
    first = rows[rep]  # each distinct row's first compute row
    sub = tiles[src[first]].with_columns([pl.Series(k, np.asarray(v, dtype=np.int64)[first])
                                          for k, v in sizes.items()])
    grep = gcode[first]
    lat_u = np.full(len(rep), np.nan)
    ok_u = np.zeros(len(rep), dtype=bool)
    groups = [(g, np.nonzero(grep == g)[0])
              for g in np.nonzero(np.bincount(grep, minlength=len(gnames)))[0]]

    def one(job):
        g, idx = job
        return evaluate(sub[idx] if len(idx) < len(rep) else sub, gnames[g], family=family)

    jobs = _shares(groups, len(rep), family)
    if len(jobs) > 1:
        try:
            with ThreadPoolExecutor(min(num_threads(), len(jobs)),
                                    thread_name_prefix="tsbatch-fused") as ex:
                outs = list(ex.map(one, jobs))
        except InputError:  # the error one call per GPU gives, word for word
            jobs = groups
            outs = [one(job) for job in jobs]
    else:
        outs = [one(job) for job in jobs]
    for (g, idx), out in zip(jobs, outs):
        lat_u[idx] = out["latency_us"].to_numpy()
        ok_u[idx] = out["feasible"].to_numpy()
    lat[rows] = lat_u[inv]
    ok[rows] = ok_u[inv]
    return lat, ok, sm[gcode]


#: distinct compute rows of the least share that one engine call evaluates on a
#: thread of its own, by compute family; a family not named runs one call per GPU
#: on the calling thread (docs/gemm_accuracy.md, "Fused families on both cores,
#: session 10": split GEMM chunks cost more CPU than they saved in wall time)
SHARE_ROWS = {"attention": 1 << 14}


def _shares(groups: list, rows: int, family: str) -> list:
    """The engine calls of :func:`_eval_compute`: ``groups`` (GPU code, distinct
    rows of that GPU) as they are, or, where there are at least two shares of
    :data:`SHARE_ROWS` rows and more than one thread, each GPU's rows cut into
    contiguous shares of at least that many rows, at most one per thread, to run
    on as many threads (a row's prediction depends on that row alone, so the
    results are the same to the bit)."""
    least = SHARE_ROWS.get(family)
    threads = num_threads()
    if not least or threads < 2 or rows < 2 * least:
        return groups
    jobs = []
    for g, idx in groups:
        k = max(1, min(threads, len(idx) // least))
        jobs += [(g, idx[len(idx) * j // k:len(idx) * (j + 1) // k]) for j in range(k)]
    return jobs


def _envelope(first: np.ndarray, comp: np.ndarray, comm: np.ndarray, c: np.ndarray,
              lead: str, slow: np.ndarray) -> np.ndarray:
    """Chunk pipeline over ``c`` chunks (prologue–steady–epilogue, TileSight Eq. 2).

    ``lead == "comm"``: comm_1, then (c-1) steady steps of max(compute under
    contention, comm), then the last compute alone. ``lead == "compute"``:
    compute_1 alone, (c-1) steady steps, then the last comm.
    """
    steady = np.maximum(comp * np.where(c > 1, slow, 1.0), comm)
    if lead == "comm":
        return comm + (c - 1) * steady + comp
    return comp + (c - 1) * steady + comm


def evaluate_fused(frame: pl.DataFrame, family: str, engine) -> pl.DataFrame:
    """Input columns followed by :data:`RESULT_COLUMNS` for ``ag_gemm``, ``gemm_rs``,
    ``ulysses`` or ``moe_ep``. ``engine(frame, hw, family)`` evaluates the GEMM or
    attention chunks: the engine's :func:`tsbatch.engine.evaluate.evaluate`, handed in
    (this module does not import the engine, which finds the family through
    :mod:`kernels_catalog.registry`)."""
    from tsbatch.collectives.model import evaluate as eval_coll
    from tsbatch.collectives.plan import default_channels

    fam = FAMILIES[family]
    df = _need(frame, fam.columns, family)
    n_rows = df.height
    tp = df["num_gpus"].to_numpy().astype(np.int64)
    c = df["chunks"].to_numpy().astype(np.int64)
    systems = df["system"].cast(pl.String)
    from tsbatch.collectives.systems import get_system

    sys_uniq, sys_code = _system_codes(systems)
    sys_objs = [get_system(x) for x in sys_uniq]
    gnames = sorted({x.gpu for x in sys_objs})
    gcode = np.array([gnames.index(x.gpu) for x in sys_objs], dtype=np.int64)[sys_code]
    reasons = _Reasons(n_rows)
    dcode = _dtype_codes(df["dtype"], family)
    e_in = _per_dtype(ELEM_BYTES, dcode)
    coll_base = {"system": df["system"], "num_gpus": df["num_gpus"]}
    for opt in ("gpus_per_node", "algorithm", "protocol"):
        if opt in df.columns:
            coll_base[opt] = df[opt]
    if family in PLACEMENT:
        m, n, k = (df[x].to_numpy().astype(np.int64) for x in ("m", "n", "k"))
        acc = infer_remote_accesses(*PLACEMENT[family])
        local = acc[-1]["local"]
        remote = acc[0]
        lm = np.where(local["m"], m // tp, m)
        ln = np.where(local["n"], n // tp, n)
        lk = np.where(local["k"], k // tp, k)
        for name, dim, glob in (("m", "m", m), ("n", "n", n), ("k", "k", k)):
            if local[dim]:
                # a dimension smaller than the TP degree leaves nothing on a GPU: say
                # so, rather than hand the GEMM a size of 0 ("must be positive")
                reasons.set(glob < tp, _empty_shard(name))
                bad = glob % tp != 0
                reasons.set(bad, f"{name} not divisible by num_gpus")
        # the rows left empty are infeasible; their GEMM is evaluated at size 1
        lm, ln, lk = (np.maximum(x, 1) for x in (lm, ln, lk))
        cm = -(-lm // c)  # chunk rows
        bad = (lm % c) != 0
        reasons.set(bad, "the GEMM's rows are not divisible by chunks")
        tiles = df.select("dtype", "block_m", "block_n", "block_k", "num_stages", "num_warps")

        def compute(need):
            return _eval_compute(tiles, {"dtype": dcode}, np.arange(n_rows), {"m": cm, "n": ln, "k": lk},
                                 gcode, gnames, need, "gemm", engine)
        elems = {"m": m, "n": n, "k": k}
        e_t = e_in if remote["tensor"] == "A" else _per_dtype(_OUT_BYTES, dcode)
        total = e_t * elems[remote["elements"][0]] * elems[remote["elements"][1]]
        chunk_bytes = _as_bytes(np.maximum(np.round(total / c), 1), reasons)
        coll_name = remote["collective"]
        lead = "comm" if remote["when"] == "before" else "compute"
        comm_frames = [(coll_name, chunk_bytes)]
    elif family == "moe_ep":
        t, hd, ff, ne, kk = (df[x].to_numpy().astype(np.int64) for x in ("tokens", "hidden", "ffn", "experts", "top_k"))
        acc = infer_moe_accesses("dp", "ep")
        bad = ne % tp != 0
        reasons.set(bad, "experts not divisible by num_gpus")
        local_e = ne // np.maximum(tp, 1)
        # uniform routing: each expert receives tokens * tp * top_k / experts rows, per chunk / c
        rows_e = np.maximum(-(-(t * tp * kk) // (ne * c)), 1)
        reasons.set((t % c) != 0, "tokens not divisible by chunks")
        tiles = df.select("dtype", "block_m", "block_n", "block_k", "num_stages", "num_warps")
        # the up rows (hidden -> ffn) then the down rows (ffn -> hidden)
        src = np.concatenate([np.arange(n_rows), np.arange(n_rows)])

        def compute(need):
            lat2, ok2, sms2 = _eval_compute(tiles, {"dtype": dcode}, src,
                                            {"m": np.concatenate([rows_e, rows_e]),
                                             "n": np.concatenate([ff, hd]),
                                             "k": np.concatenate([hd, ff])},
                                            np.concatenate([gcode, gcode]), gnames,
                                            np.concatenate([need, need]), "gemm", engine)
            # a grouped GEMM runs the rank's experts back to back: their times add
            return local_e * (lat2[:n_rows] + lat2[n_rows:]), ok2[:n_rows] & ok2[n_rows:], sms2[:n_rows]
        per = _as_bytes(t // c * kk * hd * e_in, reasons)  # a rank's dispatch send buffer per chunk
        comm_frames = [(acc[0]["collective"], per)]
        lead = "comm"
    else:  # ulysses
        b, h, s, d = (df[x].to_numpy().astype(np.int64) for x in ("batch", "heads", "seq_len", "head_dim"))
        bad = (h % tp != 0) | (s % tp != 0)
        reasons.set(bad, "heads and seq_len must be divisible by num_gpus")
        lh = h // np.maximum(tp, 1)
        ch = lh // c
        reasons.set((lh % c) != 0, "local heads not divisible by chunks")
        tiles = df.select("dtype", "block_m", "block_n", "num_stages", "num_warps", "causal")

        def compute(need):
            return _eval_compute(tiles, {"dtype": dcode}, np.arange(n_rows),
                                 {"batch": b, "heads": np.maximum(ch, 1), "seq_len": s, "head_dim": d},
                                 gcode, gnames, need, "attention", engine)
        # a rank's all-to-all send buffer for one chunk of heads: its sequence shard x chunk heads x tp
        per = _as_bytes(b * (s // np.maximum(tp, 1)) * np.maximum(ch, 1) * tp * d * e_in, reasons)
        comm_frames = [("all_to_all", per)]
        lead = "comm"
    coll = pl.DataFrame({**coll_base, "collective": _repeat(comm_frames[0][0], n_rows),
                         "bytes": np.maximum(comm_frames[0][1], 1)})
    cres = eval_coll(coll)
    comm = cres["latency_us"].to_numpy()
    cfeas = cres["feasible"].to_numpy()
    r_coll = cres["infeasible_reason"]
    # the compute chunks of the rows whose reason is already known (their own, or their
    # collective's) are never shown: not evaluated
    comp, ok, sms = compute(reasons.none() & (cfeas | r_coll.is_null().to_numpy()))
    chan = np.array([default_channels(x) for x in sys_objs], dtype=np.float64)[sys_code]
    slow = sms / np.maximum(sms - chan, 1.0)
    if family in ("ulysses", "moe_ep"):
        # ulysses: three all-to-alls (Q, K, V) before attention and one (O) after, per
        # head chunk; moe_ep: the dispatch before the experts and the combine after
        comm_in, comm_out = (3 * comm, comm) if family == "ulysses" else (comm, comm)
        steady = np.maximum(comp * np.where(c > 1, slow, 1.0), comm_in + comm_out)
        total_t = comm_in + (c - 1) * steady + comp + comm_out
        comm_total = c * (comm_in + comm_out)
        chunk_comm = comm_in + comm_out
    else:
        total_t = _envelope(comp, comp, comm, c, lead, slow)
        comm_total = c * comm
        chunk_comm = comm
    comp_total = c * comp
    # the first reason: the row's own, the collective's, the compute chunk's
    fused = reasons.series()
    if not cfeas.all():
        fused = pl.select(pl.when(pl.Series(reasons.none() & ~cfeas)).then(r_coll)
                          .otherwise(fused)).to_series()
    if not ok.all():
        fused = pl.select(pl.when(fused.is_null() & pl.Series(~ok))
                          .then(pl.lit("compute chunk infeasible (see the compute family)"))
                          .otherwise(fused)).to_series()
    feasible = fused.is_null().to_numpy()
    lat = np.where(feasible, total_t, np.nan)
    exposed = lat - comp_total
    hidden = comp_total + comm_total - lat
    overlap = 100.0 * hidden / np.maximum(np.minimum(comp_total, comm_total), 1e-12)
    return frame.with_columns(
        pl.Series("latency_us", lat),
        pl.Series("feasible", feasible),
        fused.alias("infeasible_reason"),
        pl.Series("compute_us", np.where(feasible, comp_total, np.nan)),
        pl.Series("comm_us", np.where(feasible, comm_total, np.nan)),
        pl.Series("chunk_compute_us", np.where(feasible, comp, np.nan)),
        pl.Series("chunk_comm_us", np.where(feasible, chunk_comm, np.nan)),
        pl.Series("exposed_comm_us", np.where(feasible, exposed, np.nan)),
        pl.Series("overlap_pct", np.where(feasible, overlap, np.nan)),
        _repeat(comm_frames[0][0], n_rows).alias("comm_collective"),
        pl.Series("chunk_comm_bytes", np.maximum(comm_frames[0][1], 1).astype(np.int64)),
        pl.Series("comm_algorithm", cres["algorithm_used"], dtype=pl.String),
        pl.Series("comm_protocol", cres["protocol_used"], dtype=pl.String),
        pl.Series("comm_bottleneck_link", cres["bottleneck_link"], dtype=pl.String),
    )


def _family(name: str, cols, workload, doc) -> Family:
    return Family(name=name, columns=_COMMON + cols, workload_columns=workload, lower=None, doc=doc,
                  evaluate=lambda frame, hw=None, engine=None: evaluate_fused(frame, name, engine))


AG_GEMM = _family("ag_gemm", _GEMM_COLS, ("system", "m", "n", "k", "dtype"),
                  "AllGather of the row-sharded A overlapped with the column-parallel GEMM")
GEMM_RS = _family("gemm_rs", _GEMM_COLS, ("system", "m", "n", "k", "dtype"),
                  "k-sharded GEMM overlapped with the ReduceScatter of its partial C")
ULYSSES = _family("ulysses", _ATTN_COLS, ("system", "batch", "heads", "seq_len", "head_dim", "dtype"),
                  "Ulysses sequence parallelism: all-to-all, attention on heads/sp, all-to-all")
MOE_EP = _family("moe_ep", _MOE_COLS, ("system", "tokens", "hidden", "ffn", "experts", "top_k", "dtype"),
                 "expert parallelism: all-to-all dispatch, the rank's expert GEMMs, all-to-all combine")
FAMILIES = {"ag_gemm": AG_GEMM, "gemm_rs": GEMM_RS, "ulysses": ULYSSES, "moe_ep": MOE_EP}
