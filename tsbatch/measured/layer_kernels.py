"""The fused rowwise kernels of one transformer layer, in Triton (``tsbatch measure``'s layer part).

vLLM runs each rowwise op of a layer as one fused CUDA kernel; eager PyTorch would run
several (an RMSNorm with residual is an add, a square, a mean, an rsqrt and two
multiplies). These four Triton kernels stand for vLLM's, one launch each, with the
same traffic (what :mod:`tsbatch.serving.ops` counts):

- :func:`add_rmsnorm` -- ``fused_add_rms_norm`` (residual given: ``residual += x``,
  ``x = rmsnorm(residual) * w``, both in place) or ``rms_norm`` in place (no residual;
  the QK-norm over each head);
- :func:`silu_mul` -- ``silu_and_mul``: ``out = silu(x[:, :d]) * x[:, d:]``;
- :func:`rope` -- ``rotary_embedding`` (NeoX halves) in place on the q and k heads of the
  QKV projection's output, cos / sin read from a ``(positions, head_dim)`` cache;
- :func:`kv_write` -- ``reshape_and_cache_flash``: each token's k and v heads copied
  into the cache slot ``slots[token]`` of a ``(slots, kv_heads, head_dim)`` cache.

Imported only by :func:`tsbatch.measured.layer.run_layer` (this module imports triton).
Their plain-torch twins are :func:`tsbatch.measured.layer.reference_ops`;
``tests/test_layer_measure.py`` compares the two (Triton's interpreter on the CPU) where
torch is installed.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["add_rmsnorm", "silu_mul", "rope", "kv_write"]


def _warps(block: int) -> int:
    return 4 if block <= 1024 else (8 if block <= 4096 else 16)


@triton.jit
def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, n_cols, eps,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        x = x + r
        tl.store(res_ptr + row * n_cols + cols, x.to(res_ptr.dtype.element_ty), mask=mask)
    var = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + row * n_cols + cols, (x * rstd * w).to(x_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm(x, weight, residual=None, eps: float = 1e-5) -> None:
    """In place: ``residual += x; x = rmsnorm(residual) * weight`` (``x = rmsnorm(x) *
    weight`` without a residual). ``x`` (and ``residual``): contiguous ``(rows, n)``."""
    rows, n = x.shape
    block = triton.next_power_of_2(n)
    res = x if residual is None else residual
    _add_rmsnorm_kernel[(rows,)](x, res, weight, n, eps, HAS_RES=residual is not None,
                                 BLOCK=block, num_warps=_warps(block))


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    a = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out_ptr + row * d + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(x, out) -> None:
    """``out = silu(x[:, :d]) * x[:, d:]``; ``x`` contiguous ``(rows, 2 d)``, ``out`` ``(rows, d)``."""
    rows, d = out.shape
    block = min(1024, triton.next_power_of_2(d))
    _silu_mul_kernel[(rows, triton.cdiv(d, block))](x, out, d, BLOCK=block,
                                                    num_warps=_warps(block))


@triton.jit
def _rope_kernel(qkv_ptr, pos_ptr, cache_ptr, row_stride, n_heads, half,
                 HB: tl.constexpr, DB: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    h = tl.arange(0, HB)[:, None]
    d = tl.arange(0, DB)[None, :]
    mask = (h < n_heads) & (d < half)
    base = qkv_ptr + t * row_stride + h * (2 * half) + d
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + half, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cache_ptr + pos * (2 * half) + d, mask=d < half, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * (2 * half) + half + d, mask=d < half, other=0.0).to(tl.float32)
    tl.store(base, (x1 * cos - x2 * sin).to(qkv_ptr.dtype.element_ty), mask=mask)
    tl.store(base + half, (x2 * cos + x1 * sin).to(qkv_ptr.dtype.element_ty), mask=mask)


def rope(qkv, positions, cos_sin, n_heads: int, head_dim: int) -> None:
    """In place on the first ``n_heads`` heads (q then k) of each row of ``qkv`` (``(tokens,
    (hq + 2 hkv) head_dim)``, last dim contiguous): NeoX rotation by ``cos_sin[position]``
    (``(positions, head_dim)``: cos in the first half, sin in the second)."""
    half = head_dim // 2
    hb = triton.next_power_of_2(n_heads)
    db = triton.next_power_of_2(half)
    _rope_kernel[(qkv.shape[0],)](qkv, positions, cos_sin, qkv.stride(0), n_heads, half,
                                  HB=hb, DB=db, num_warps=_warps(hb * db))


@triton.jit
def _kv_write_kernel(qkv_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, row_stride, k_off, width,
                     BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    k = tl.load(qkv_ptr + t * row_stride + k_off + cols, mask=mask)
    v = tl.load(qkv_ptr + t * row_stride + k_off + width + cols, mask=mask)
    tl.store(k_cache_ptr + slot * width + cols, k, mask=mask)
    tl.store(v_cache_ptr + slot * width + cols, v, mask=mask)


def kv_write(qkv, slots, k_cache, v_cache, q_width: int, kv_width: int) -> None:
    """Copy each row's k (columns ``q_width .. q_width + kv_width``) and v (the next
    ``kv_width``) of ``qkv`` into row ``slots[row]`` of the caches (contiguous, ``kv_width``
    elements a slot)."""
    block = triton.next_power_of_2(kv_width)
    _kv_write_kernel[(qkv.shape[0],)](qkv, slots, k_cache, v_cache, qkv.stride(0), q_width,
                                      kv_width, BLOCK=block, num_warps=_warps(block))
