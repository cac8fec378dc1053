"""The GEMM lowering kernel (``kernels_catalog.gemm._lower_rows``, through
``lower``) against its plain-Python twin, row by row, on every GPU file."""

from __future__ import annotations

import naive
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_catalog import gemm
from tsbatch.evaluate import get_family
from tsbatch.hw import get_hw, list_hw
from tsbatch.kernels.envelope import R_CUDA, R_DRAM, R_L2, R_SMEM, R_TC
from tsbatch.schema import validate

pow2 = lambda lo, hi: st.integers(lo, hi).map(lambda e: 2 ** e)  # noqa: E731

row = st.fixed_dictionaries({
    "m": st.integers(1, 70000), "n": st.integers(1, 70000), "k": st.integers(1, 70000),
    "block_m": pow2(3, 9), "block_n": pow2(3, 9), "block_k": pow2(3, 8),
    "num_stages": st.integers(1, 8), "num_warps": pow2(0, 6), "split_k": st.integers(1, 16),
    "dtype": st.sampled_from(sorted(naive.GEMM_DTYPES)), "tf32": st.booleans(),
    "a_row_major": st.booleans(), "b_row_major": st.booleans(),
})


def _check(rows: list[dict], hw) -> None:
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    blocked = gemm.admit(cols)  # rows Triton cannot build are lowered from placeholders
    for i, r in enumerate(rows):
        if blocked[i]:
            assert min(r["block_m"], r["block_n"], r["block_k"]) < gemm.TRITON_MIN_DOT \
                or r["block_m"] * r["block_n"] > gemm.TRITON_MAX_TENSOR_NUMEL, r
            assert plan.unlowered[i]
            continue
        want = naive.gemm_lower_one(r, hw)
        got = {
            "g0": plan.g0[i], "g1": plan.g1[i], "ksteps": plan.ksteps[i],
            "tiles": plan.extra["tiles"][i], "smem_block": plan.smem_block[i],
            "threads": plan.threads[i], "regs_thread": plan.regs_thread[i],
            "register_spill": plan.extra["register_spill"][i],
            "mma_path": str(plan.extra["mma_path"][i]),
            "tensor_core": plan.work_iter[i, R_TC], "cuda_core": plan.work_iter[i, R_CUDA],
            "l2_iter": plan.work_iter[i, R_L2], "smem": plan.work_iter[i, R_SMEM],
            "t_bytes": tuple(plan.t_bytes[i]), "l2_epi": plan.work_epi[i, R_L2],
            "dram_epi": plan.work_epi[i, R_DRAM], "cuda_epi": plan.work_epi[i, R_CUDA],
            "tc_rate": plan.rate[i, R_TC], "share_eff": plan.share_eff[i],
            "useful_flops": plan.useful_flops[i],
        }
        for key, w in want.items():
            g = got[key]
            if isinstance(w, tuple):
                np.testing.assert_allclose(g, w, rtol=1e-15, err_msg=f"{key} row {r}")
            elif isinstance(w, float):
                assert g == pytest.approx(w, rel=1e-15), (key, r)
            else:
                assert g == w, (key, r, g, w)
        assert plan.g2[i] == r["split_k"]


@settings(max_examples=60, deadline=None)
@given(st.lists(row, min_size=1, max_size=40), st.sampled_from(list_hw()))
def test_lowering_matches_twin(rows, gpu):
    _check(rows, get_hw(gpu))


def test_lowering_covers_every_mma_path():
    """wgmma, warp MMA and FMA rows, with and without spills, in one batch."""
    hw = get_hw("h100_sxm")
    base = dict(m=4096, n=4096, k=4096, block_k=64, num_stages=3, split_k=1, tf32=False,
                a_row_major=True, b_row_major=True)
    rows = [dict(base, block_m=128, block_n=256, num_warps=8, dtype="float16"),   # wgmma
            dict(base, block_m=32, block_n=64, num_warps=4, dtype="bfloat16"),    # mma_sync
            dict(base, block_m=64, block_n=64, num_warps=4, dtype="float32"),     # fma
            dict(base, block_m=256, block_n=256, num_warps=1, dtype="float16",
                 split_k=4, a_row_major=False, b_row_major=False)]                # spills
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    plan = gemm.lower(cols, hw)
    assert list(plan.extra["mma_path"]) == ["wgmma", "mma_sync", "fma", "mma_sync"]
    assert plan.extra["register_spill"][3] > 0
    _check(rows, hw)


@pytest.mark.parametrize("bm", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("bn", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("warps", [1, 2, 4, 8])
def test_fma_smem_bytes_matches_twin(bm, bn, warps):
    for bk in (16, 32, 64):
        for a_rm in (False, True):
            for b_rm in (False, True):
                assert gemm._fma_smem_bytes(bm, bn, bk, warps, a_rm, b_rm) == \
                    naive.fma_smem_bytes(bm, bn, bk, warps, a_rm, b_rm)


def test_fma_smem_bytes_by_hand():
    # 64 x 64 tile, 4 warps: 16 lanes x 4 columns span the 64 columns, 2 lanes along M,
    # all 4 warps along M (8 rows a lane). Per k and warp: B row-major 16 x 16 B = 2
    # wavefronts; B column-major 16 columns in one bank group, per 4 k: 4 x 16 / 4 = 16;
    # A row-major 8 rows x 2 lanes / 4 = 4; A column-major 8 broadcasts
    per_k = {(True, True): 4 + 2, (False, True): 8 + 2, (True, False): 4 + 16,
             (False, False): 8 + 16}
    for (a_rm, b_rm), wf in per_k.items():
        assert gemm._fma_smem_bytes(64, 64, 32, 4, a_rm, b_rm) == 128.0 * 32 * 4 * wf
    # the layout decides it, not the tile alone: B column-major costs more on every shape
    for bm, bn, w in ((16, 16, 1), (128, 32, 4), (32, 128, 8), (256, 256, 8)):
        assert gemm._fma_smem_bytes(bm, bn, 32, w, True, False) > \
            gemm._fma_smem_bytes(bm, bn, 32, w, True, True)


def test_tf32_mn_major_operand_on_warpgroup_mma_by_hand():
    """Triton feeds TF32 to warpgroup MMA K-major only: an M/N-contiguous operand
    is loaded one 4-byte element per thread with the warp along K, each element
    costing one L1TEX wavefront per ``l1_lines_per_wavefront`` lines, as shared-
    memory work (bytes at the shared-memory rate); K-major operands, the mma.sync
    path (A100) and the library rows pay nothing extra."""
    base = dict(m=4096, n=4096, k=4096, block_m=128, block_n=128, block_k=32, num_stages=3,
                num_warps=4, split_k=1, dtype="float32", tf32=True)
    layouts = [(True, False), (True, True), (False, False), (False, True)]  # K-major first
    rows = [dict(base, a_row_major=a, b_row_major=b) for a, b in layouts]
    cols, _ = validate(pl.DataFrame(rows), get_family("gemm"))
    h100 = get_hw("h100")
    plan = gemm.lower(cols, h100)
    assert np.all(plan.share_eff == h100.cal("wgmma_share_efficiency"))  # the wgmma path
    per_elem = h100.smem_bytes_per_clk / h100.cal("l1_lines_per_wavefront") - 4
    extra = plan.work_iter[:, R_SMEM] - plan.work_iter[0, R_SMEM]
    op = 32 * 128  # elements of one operand tile per iteration (BM x BK = BK x BN)
    assert extra.tolist() == pytest.approx([0.0, op * per_elem, op * per_elem, 2 * op * per_elem])
    a100 = gemm.lower(cols, get_hw("a100")).work_iter[:, R_SMEM]
    assert np.all(a100 == a100[0])
    lib_rows = [dict(r, backend="cublas") for r in rows]
    cols, _ = validate(pl.DataFrame(lib_rows), get_family("gemm"))
    lib = gemm.lower(cols, h100)
    assert not np.any(lib.work_iter[:, R_SMEM] - lib.work_iter[0, R_SMEM] > 0.5 * op * per_elem)
