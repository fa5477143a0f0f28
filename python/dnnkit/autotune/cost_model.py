"""First cost model: predicts an algorithm's time for a problem from its operation count and the bytes
its extra passes move, against nominal ceilings of this machine, with per-algorithm efficiencies.

The efficiencies were fitted to bench/conv.py's ResNet-50 measurements (RESULTS.md): on those 40
layer/batch cases the predicted fastest algorithm was within 10% of the measured fastest in 39. The
ceilings are nominal (FMA width of the active ISA at 2.5 GHz per thread, 10 GB/s per thread of copy
bandwidth), not measured; replacing them with measured ones, and the constants with efficiencies fitted
from the tuning cache, is the autotuner's job. predict() returns None for algorithms it has no formula
for; dispatch then keeps the registry's order.
"""
from __future__ import annotations

import math

from .. import _cpu
from .._config import get_num_threads

_FLOPS_PER_CYCLE = {"avx512": 64, "avx2": 32, "ref": 4}  # float32 FMA throughput per core, nominal
_GHZ = 2.5
_COPY_BYTES_PER_S = 10e9  # per thread
_TRANSFORM_S_PER_ELEMENT = 2.8e-9  # per thread: one Winograd transform output element (measured 1.4 ns on 2)


def _peak(p) -> float:
    flops = _FLOPS_PER_CYCLE.get(_cpu.active_isa(), 4) * _GHZ * 1e9 * get_num_threads()
    return flops if p.itemsize == 4 else flops / 2


def gemm_efficiency(m: int, n: int, k: int) -> float:
    """Fraction of peak the blocked GEMM reaches: lower for narrow N, short K and few rows."""
    if min(m, n, k) <= 0:
        return 1.0
    rows_used = min(1.0, m / 6)  # a 6-row micro-tile computes 6 rows whatever m is
    return 0.62 * min(1.0, n / 384) ** 0.5 * min(1.0, k / 256) ** 0.35 * min(1.0, m / 64) ** 0.3 * rows_used


def _conv_dims(p):
    """(n, c, k, g, c/g, k/g, output pixels, direct-convolution FLOPs, peak FLOP/s) of a convolution."""
    n, c, k, g = p.mb, p.ic, p.oc, p.g
    pq = p.oh * p.ow
    return n, c, k, g, c // g, k // g, pq, 2 * n * k * pq * (c // g) * p.kh * p.kw, _peak(p)


def _conv_fwd(p, name):
    n, c, k, g, cg, kg, pq, direct, peak = _conv_dims(p)
    threads = get_num_threads()
    if name == "im2col_gemm":
        pointwise = (p.kh, p.kw, p.sh, p.sw, p.ph, p.pw) == (1, 1, 1, 1, 0, 0)
        cols = pq * (n if pq < 512 else 1)
        t = direct / (peak * gemm_efficiency(kg, cols, cg * p.kh * p.kw))
        if not pointwise:
            t += 2 * n * c * p.kh * p.kw * pq * p.itemsize / (_COPY_BYTES_PER_S * threads)
        return t
    if name in ("winograd_f4x4_3x3", "winograd_f2x2_3x3"):
        m = 4 if name == "winograd_f4x4_3x3" else 2
        a2 = (m + 2) ** 2
        tiles = n * math.ceil(p.oh / m) * math.ceil(p.ow / m)
        t = 2 * a2 * kg * cg * tiles * g / (peak * gemm_efficiency(kg, tiles, cg))
        t += (cg + kg) * g * tiles * a2 * _TRANSFORM_S_PER_ELEMENT / threads
        t += k * cg * a2 * p.itemsize * 2 / (_COPY_BYTES_PER_S * threads)  # filter transform
        return t
    if name == "fft":
        hf, wf = p.ih + 2 * p.ph, p.iw + 2 * p.pw
        freqs = hf * (wf // 2 + 1)
        reduce = 8 * n * k * cg * freqs / (peak * 0.08)
        transforms = (n * (c + k) + k * cg) * hf * wf * 5 * math.log2(max(hf * wf, 2)) / (peak * 0.05)
        return reduce + transforms
    if name == "direct":
        # The forward kernel's 8-channel x 32-column register block is full only with >= 8 output
        # channels per group and >= 32 output columns (measured 42 GFLOP/s at 64 channels, 56 wide).
        eff = 0.13 * min(1.0, kg / 8) * min(1.0, p.ow / 32) ** 0.7
        return direct / (peak * eff)
    return None


def _conv_bwd(p, name):
    n, c, k, g, cg, kg, pq, direct, peak = _conv_dims(p)
    if name in ("gemm_col2im", "im2col_gemm"):
        crs = cg * p.kh * p.kw
        m, cols, inner = (crs, pq, kg) if p.direction == "bwd_data" else (kg, crs, pq)
        t = direct / (peak * gemm_efficiency(m, cols, inner))
        t += 2 * n * c * p.kh * p.kw * pq * p.itemsize / (_COPY_BYTES_PER_S * get_num_threads())
        return t
    if name == "direct":
        return direct / (peak * 0.06)
    return None


_MODELS = {"conv2d_fwd": _conv_fwd, "conv2d_bwd_data": _conv_bwd, "conv2d_bwd_filter": _conv_bwd}


def predict(algorithm, p) -> float | None:
    """Predicted seconds for algorithm on problem p, or None when the model has no formula for it."""
    model = _MODELS.get(p.op)
    return None if model is None else model(p, algorithm.name)
