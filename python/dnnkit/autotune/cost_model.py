"""The cost model: predicts an algorithm's time for a problem from its operation count and the bytes its
extra passes move, against this machine's ceilings, with a per-algorithm efficiency.

Ceilings: the float32 FMA peak and the per-thread copy bandwidth, measured by `dnnkit autotune` (see
measure_ceilings) and kept in the tuning cache per device; until they are measured, or where the stored
peak is implausible (plausible_peak: under 40% of the nominal figure), nominal values (the active ISA's
FMA width at 2.5 GHz per thread, 10 GB/s per thread) stand in. ceilings() says which are in use;
`dnnkit info --peak` prints it.

Efficiencies: the formulas below carry efficiencies first fitted to bench/conv.py's ResNet-50
measurements (bench/log/2026-11-22-to-24.md). On top, every algorithm gets a correction factor fitted
from the measured records in the tuning cache for this device and version: the median of measured /
predicted over its records (at least MIN_SAMPLES of them), clamped to [1/8, 8]. So the model improves
as the cache grows.

predict() returns None for algorithms it has no formula for (GEMM's two algorithms are told apart by
their supports() rules); dispatch then keeps the registry's order.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
import warnings

from ..backends import cpu as _cpu
from .._config import get_num_threads
from ..algos.conv_cpu import as_forward

_COPY_BYTES_PER_S = 10e9  # per thread
# Winograd's transforms in the time of this many float32 FLOPs at the peak (they are vector arithmetic
# on the same units, so they scale with the measured peak and the ISA's width as the products do):
# fitted to bench/conv.py's ResNet-50 3x3 layers (bench/log/2026-11-22-to-24.md, cache-resident schedule).
_TRANSFORM_FLOPS = 192.0  # one input or output transform element
_FILTER_FLOPS = 480.0  # one element of U, transformed, stored and read back
_FILTER_FEW_FLOPS = 96.0  # the same in the few-tiles schedule (U^T built in L2, never stored)
_WINOGRAD_GEMM_EFFICIENCY = 0.7  # the transform-domain products on the micro-kernel, operands in L2
_WINOGRAD_FEW_TILES = 32
_WINOGRAD_BWD_DEPTH = 256  # csrc/conv/winograd.cpp kBwdDepth: tiles per chunk of the backward filter


MIN_SAMPLES = 2
_CLAMP = 8.0


nominal_peak_flops = _cpu.nominal_peak_flops


# A measured float32 peak under this share of the nominal figure was taken while other work held the
# cores: not a ceiling of this machine.
PLAUSIBLE_PEAK_SHARE = 0.4


def plausible_peak(flops: float) -> bool:
    """Whether a measured float32 peak (FLOP/s, dnnkit's threads) can be this machine's ceiling."""
    return flops >= PLAUSIBLE_PEAK_SHARE * nominal_peak_flops()


def ceilings() -> dict:
    """The ceilings the model uses now: peak_flops, copy_bytes_per_s (per thread), and source, which says
    whether they were measured (measure_ceilings, kept in the tuning cache) or are nominal, and why."""
    measured = _calibration()["ceilings"]
    nominal = {"peak_flops": nominal_peak_flops(), "copy_bytes_per_s": _COPY_BYTES_PER_S}
    if measured is None:
        return {**nominal, "source": "nominal: not measured on this device yet (dnnkit autotune measures them)"}
    if not plausible_peak(measured["peak_flops"]):
        return {**nominal, "source": f"nominal: the stored peak of {measured['peak_flops'] / 1e9:.0f} GFLOP/s is "
                                     f"under {PLAUSIBLE_PEAK_SHARE:.0%} of the ISA's nominal figure, measured under "
                                     "load (dnnkit autotune measures again)"}
    return {**measured, "source": "measured"}


def _peak(p) -> float:
    flops = ceilings()["peak_flops"]
    return flops if p.itemsize == 4 else flops / 2


def _copy_bytes_per_s() -> float:
    """Copy bandwidth per thread."""
    return ceilings()["copy_bytes_per_s"]


@functools.lru_cache(maxsize=None)
def _micro_rows(isa: str, itemsize: int) -> int:
    return _cpu.ukernel_info(isa, itemsize)[1]


def micro_rows(itemsize: int = 4) -> int:
    """MR of the active ISA's GEMM micro-kernel for this element size."""
    return _micro_rows(_cpu.active_isa(), itemsize)


@functools.lru_cache(maxsize=None)
def _micro_cols(isa: str, itemsize: int) -> int:
    return _cpu.ukernel_info(isa, itemsize)[2]


def _transposes(m: int, n: int) -> bool:
    """csrc/gemm/gemm.cpp's transposing_helps: few, badly filled columns and many more rows."""
    nr = _micro_cols(_cpu.active_isa(), 4)
    if n >= 4 * nr or m <= 2 * n:
        return False
    return m / (math.ceil(m / nr) * nr) > n / (math.ceil(n / nr) * nr) + 0.1


@functools.lru_cache(maxsize=None)
def _gemm_mc(isa: str, itemsize: int) -> int:
    """MC of csrc/gemm/blocking.h: rows of A per packed block (B is packed once per block)."""
    return _cpu.ukernel_info(isa, itemsize)[3]


def gemm_efficiency(m: int, n: int, k: int) -> float:
    """Fraction of peak the blocked GEMM reaches: lower for narrow N, short K and few rows."""
    if min(m, n, k) <= 0:
        return 1.0
    if _transposes(m, n):
        return 0.75 * gemm_efficiency(n, m, k)  # solved as C^T = B^T A^T, C written through its strides
    rows_used = min(1.0, m / micro_rows())  # fewer rows than MR stream B for less work
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
        # Small planes go side by side in one GEMM, but measured (7x7 and 14x14 planes at batch 8) that
        # GEMM runs about as fast as one image's would: threads then split its rows, not its columns.
        t = direct / (peak * gemm_efficiency(kg, pq, cg * p.kh * p.kw))
        # The GEMM packs its B operand (the columns, or the input planes of a 1x1 layer) once per block
        # of MC output channels, and building the columns is one more copy.
        copy = 2 * n * c * p.kh * p.kw * pq * p.itemsize / (_copy_bytes_per_s() * threads)
        t += copy * (math.ceil(kg / _gemm_mc(_cpu.active_isa(), p.itemsize)) + (0 if pointwise else 1))
        if pq < 512 and n > 1:  # images side by side: the GEMM's output is copied back to NCHW
            t += 2 * n * k * pq * p.itemsize / (_copy_bytes_per_s() * threads)
        return t
    if name == "implicit_gemm":
        # csrc/conv/implicit.cpp: one GEMM per (image, group), each on one thread while there are enough
        # of them; its B panels are packed from the image (the columns read and written once, as the
        # GEMM packs a 1x1 layer's input), which is first copied zero-padded when the convolution pads,
        # and the filters (A) are packed once for all products. A thread runs whole products, so a
        # narrow plane costs less than in one GEMM split across the threads.
        eff = gemm_efficiency(kg, max(pq, 384), cg * p.kh * p.kw) * min(1.0, pq / 384) ** 0.25
        t = direct / (peak * eff)
        bw = _copy_bytes_per_s() * threads
        t += 2 * n * c * p.kh * p.kw * pq * p.itemsize / bw
        t += 2 * k * cg * p.kh * p.kw * p.itemsize / bw
        if p.ph or p.pw:
            t += 3 * n * c * (p.ih + 2 * p.ph) * (p.iw + 2 * p.pw) * p.itemsize / bw
        return t
    if name in ("winograd_f4x4_3x3", "winograd_f2x2_3x3"):
        # csrc/conv/winograd.cpp: chunks of 64 tiles as the micro-kernel's columns (the last one padded),
        # or, at most 32 tiles (and no more than Kg), tiles as exact rows and channels padded to 64.
        m = 4 if name == "winograd_f4x4_3x3" else 2
        a2 = (m + 2) ** 2
        tiles = n * math.ceil(p.oh / m) * math.ceil(p.ow / m)
        few = tiles <= _WINOGRAD_FEW_TILES and tiles <= kg
        mr = micro_rows(p.itemsize)
        rows, cols = (math.ceil(tiles / mr) * mr, math.ceil(kg / 64) * 64) if few else (kg, math.ceil(tiles / 64) * 64)
        t = 2 * a2 * rows * cols * cg * g / (peak * _WINOGRAD_GEMM_EFFICIENCY)
        t += (cg + kg) * g * tiles * a2 * _TRANSFORM_FLOPS / peak
        t += k * cg * a2 * (_FILTER_FEW_FLOPS if few else _FILTER_FLOPS) / peak
        return t
    if name == "fft":
        # algos/conv_cpu.py FftFwd: the filters' DFT written as F x 2Cg x K reals (a fresh array: bound by
        # first-touch writes), per frequency one real GEMM of 2n x 2Cg x K reading that once, and scipy's
        # transforms of the padded inputs and outputs (fitted on 3x3 and 7x7 layers at batch 8).
        from scipy.fft import next_fast_len

        hf, wf = next_fast_len(p.ih + 2 * p.ph, real=True), next_fast_len(p.iw + 2 * p.pw, real=True)
        freqs = hf * (wf // 2 + 1)
        w_bytes = freqs * 2 * cg * k * p.itemsize
        stream = _copy_bytes_per_s() * get_num_threads()
        filters = 12 * w_bytes / stream
        reduce = 8 * n * k * cg * freqs / (peak * 0.07) + w_bytes / stream
        transforms = n * (c + k) * hf * wf * 5 * math.log2(max(hf * wf, 2)) / (peak * 0.02)
        return filters + reduce + transforms
    if name == "depthwise":
        # Memory-bound: the padded input plane is copied, then read, and the output written once.
        moved = (3 * n * c * p.ih * p.iw + n * k * pq) * p.itemsize
        return moved / (_copy_bytes_per_s() * get_num_threads()) + direct / (peak * 0.1)
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
        t += 2 * n * c * p.kh * p.kw * pq * p.itemsize / (_copy_bytes_per_s() * get_num_threads())
        return t
    if name == "direct":
        return direct / (peak * 0.06)
    if name in ("winograd_f4x4_3x3", "winograd_f2x2_3x3") and p.direction == "bwd_filter":
        # csrc/conv/winograd.cpp's transposed algorithm: per point a GEMM over the tiles (kBwdDepth at a
        # time) accumulated in M (alpha^2 x Kg x Cg a group), written by every chunk, read by every chunk
        # after the first and by the final transform; two transforms a tile as the forward pass has,
        # each followed by a transpose into the panels (about twice the forward's cost, measured on
        # ResNet-50's 3x3 layers at batch 8).
        m = 4 if name == "winograd_f4x4_3x3" else 2
        a2 = (m + 2) ** 2
        tiles = n * math.ceil(p.oh / m) * math.ceil(p.ow / m)
        mr = micro_rows(p.itemsize)
        threads = get_num_threads()
        t = 2 * a2 * math.ceil(kg / mr) * mr * cg * tiles * g / (peak * _WINOGRAD_GEMM_EFFICIENCY)
        t += 2 * (cg + kg) * g * tiles * a2 * _TRANSFORM_FLOPS / peak
        chunks = math.ceil(tiles / _WINOGRAD_BWD_DEPTH)
        t += a2 * kg * cg * g * p.itemsize * 2 * chunks / (_copy_bytes_per_s() * threads)
        return t
    if name in ("winograd_f4x4_3x3", "winograd_f2x2_3x3") and p.direction == "bwd_data":
        # The forward pass on dy, its filter transforms reading the filters turned (csrc/conv/winograd.cpp).
        return _conv_fwd(as_forward(p), name)
    return None


_MODELS = {"conv2d_fwd": _conv_fwd, "conv2d_bwd_data": _conv_bwd, "conv2d_bwd_filter": _conv_bwd}


def raw_predict(name: str, p) -> float | None:
    """The formula's seconds for the algorithm called name on p, before the fitted correction."""
    model = _MODELS.get(p.op)
    return None if model is None else model(p, name)


def predict(algorithm, p) -> float | None:
    """Predicted seconds for algorithm on problem p, or None when the model has no formula for it."""
    t = raw_predict(algorithm.name, p)
    if t is None:
        return None
    return t * _calibration()["factors"].get((p.op, algorithm.name), 1.0)


def correction_factors() -> dict:
    """{(op, algorithm): measured / predicted} fitted from the cache, for this device and version."""
    return dict(_calibration()["factors"])


# The fit, kept between calls: the store and device it is for, the highest rowid read, and per problem key
# its (op, algorithm, measured / predicted) samples. A write adds or replaces rows, whose rowids are then
# above the last one read: only those are parsed again. Fewer rows than problems fitted (a cleared cache)
# means a fit from scratch.
_fit: dict = {"for": None, "top": 0, "samples": {}, "generation": None, "value": None}


def _calibration() -> dict:
    """Ceilings and correction factors for this device and version, from the default cache, brought up to
    date when the cache changes (incrementally: only rows written since the last fit are read)."""
    from . import cache

    generation = cache.generation()
    device, version = cache.device_fingerprint(), cache._version()
    target = (str(cache.cache_path()), device, version)
    if _fit["for"] == target and _fit["generation"] == generation and _fit["value"] is not None:
        return _fit["value"]
    value = {"ceilings": None, "factors": {}}
    if _fit["for"] != target:
        _fit.update({"for": target, "top": 0, "samples": {}})
    _fit["generation"], _fit["value"] = generation, value  # set first: the fit below calls the formulas
    try:
        store = cache.default_store()
        value["ceilings"] = store.get_ceilings()
        new, count, top = store.device_rows(device, version, _fit["top"])
        if top < _fit["top"]:  # another store, or rows renumbered: start over
            _fit.update({"top": 0, "samples": {}})
            new, count, top = store.device_rows(device, version, 0)
        for _, problem, records in new:
            _fit["samples"][problem] = _samples(cache, problem, records)
        if count < len(_fit["samples"]):  # rows removed since the last fit
            _fit["samples"] = {problem: _samples(cache, problem, records)
                               for _, problem, records in store.device_rows(device, version, 0)[0]}
        _fit["top"] = top
        ratios: dict = {}
        for samples in _fit["samples"].values():
            for key, ratio in samples:
                ratios.setdefault(key, []).append(ratio)
        value["factors"] = {
            k: min(_CLAMP, max(1 / _CLAMP, float(statistics.median(v))))
            for k, v in ratios.items() if len(v) >= MIN_SAMPLES
        }
    except Exception as e:  # noqa: BLE001 - an unreadable cache means the uncorrected model, not a failure
        warnings.warn(f"dnnkit: cost model: could not read the tuning cache ({e}); using nominal values",
                      RuntimeWarning, stacklevel=3)
    return value


def _samples(cache, problem: str, records_json: str) -> list:
    """[((op, algorithm), measured / predicted)] of one stored result; [] for a row this dnnkit cannot read
    (it is skipped, never fitted)."""
    import json

    from .records import TuneRecord

    try:
        p = cache.parse_problem_key(problem)
        records = [TuneRecord.from_dict(r) for r in json.loads(records_json)]
    except (ValueError, TypeError):
        return []
    out = []
    for r in records:
        t = raw_predict(r.algorithm, p) if r.ok else None
        if t and r.median_s:
            out.append(((p.op, r.algorithm), r.median_s / t))
    return out


def measure_ceilings(store=None, seconds: float = 0.2, attempts: int = 3) -> dict:
    """Measure the float32 FMA peak (all threads) and the copy bandwidth of one thread, and keep them in
    the cache for this device (about half a second). A peak that is implausible (plausible_peak), or on
    several threads under 0.6x one thread's times their count (other work holds some of the cores), is
    measured again, up to `attempts` times; if it stays so, nothing is stored (the model keeps what it
    had), with a warning. Returns the figures and whether they were stored."""
    from . import cache

    nt = get_num_threads()
    for attempt in range(attempts):
        peak = _cpu.measure_peak_flops(nt, seconds)
        one = _cpu.measure_peak_flops(1, seconds) if nt > 1 else peak
        if plausible_peak(peak) and peak >= 0.6 * nt * one:
            break
        time.sleep(0.2)
    else:
        warnings.warn(f"dnnkit: the float32 peak measured {peak / 1e9:.0f} GFLOP/s on {nt} thread(s) "
                      f"({one / 1e9:.0f} on one): other work holds the cores; not stored", RuntimeWarning,
                      stacklevel=2)
        return {"peak_flops": peak, "copy_bytes_per_s": None, "stored": False}
    copy = _cpu.measure_copy_bandwidth()
    (store or cache.default_store()).put_ceilings(peak, copy)
    return {"peak_flops": peak, "copy_bytes_per_s": copy, "stored": True}
