"""The cost model: predicts an algorithm's time for a problem from its operation count and the bytes its
passes move, against this device's ceilings. Each algorithm states its formula next to its code
(Algorithm.cost, a roofline term plus its efficiency); this module supplies the ceilings it scales by and a
correction fitted to this device's measurements.

Ceilings (device_ceilings): on the CPU, the float32 FMA peak and the per-thread copy bandwidth, measured by
`dnnkit autotune` (see measure_ceilings) and kept in the tuning cache per device; until they are
measured, where the stored peak is implausible (plausible_peak: under 40% of the nominal figure), or
where the stored row is not positive finite numbers (cache.Store.get_ceilings: ignored, with a warning),
nominal values (two FMAs a cycle per thread at 2.5 GHz, each of the active ISA's width or of the core's
FMA datapath where narrower: backends/cpu.py flops_per_cycle; a copy rate per thread by the core's FMA
datapath: nominal_copy_bytes_per_s) stand in.
ceilings() says which are in use; `dnnkit info --peak` prints it. On the GPU, its FP32 rate and copy
bandwidth as `dnnkit autotune --device cuda` measures them (measure_gpu_ceilings), the TF32 rate scaled
from the nominal by the measured clock, or until then the device's nominal FP32, TF32 and DRAM figures
(backends/cuda.py); without a GPU there is no prediction.

Correction: a factor fitted from the measured records in the tuning cache for this device (the CPU's, or
the GPU's for GPU problems) and version, in two parts. The operator's scale: the median of measured /
predicted over all its algorithms' records (at least MIN_SAMPLES of them), which moves every algorithm
alike and so keeps the formulas' ranking. Each algorithm's own deviation from that scale, taken from its
records on problems like the one asked about: a kernel-weighted mean of log(measured / predicted) over
them, each weighted by exp(-d^2 / 2 SIMILAR_LOG2^2), d the distance between the problems' sizes in log2
units (features: batch, channels, plane, GEMM dimensions, sequence, hidden), times OTHER_KIND_WEIGHT where
their kinds differ (kernel size, stride, layout, cell), and shrunk toward the scale by PRIOR_WEIGHT (the
weight of a record of this very problem is 1). One factor per algorithm does worse: an algorithm whose
formula is pessimistic on some shapes (the direct kernel's backward filter on 1x1 layers) becomes
preferred on all of them (`bench/autotune.py`, its fitted column). The factor is clamped to [1/8, 8]. So
the model improves as the cache grows, and a problem unlike any measured keeps the formulas' ranking.

predict() returns None for an algorithm without a formula; dispatch then keeps the registry's order.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings

import numpy as np

from ..backends import cpu as _cpu
from .._config import generation, get_num_threads
from ..algos.base import Ceilings

MIN_SAMPLES = 2
_CLAMP = 8.0
SIMILAR_LOG2 = 1.0  # a record of a problem twice as large in one feature weighs exp(-1/2) of one the same
OTHER_KIND_WEIGHT = 0.1
PRIOR_WEIGHT = 0.3


nominal_peak_flops = _cpu.nominal_peak_flops
nominal_copy_bytes_per_s = _cpu.nominal_copy_bytes_per_s


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
    nominal = {"peak_flops": nominal_peak_flops(), "copy_bytes_per_s": nominal_copy_bytes_per_s()}
    if measured is None:
        return {**nominal, "source": "nominal: not measured on this device yet (dnnkit autotune measures them)"}
    if not plausible_peak(measured["peak_flops"]):
        return {**nominal, "source": f"nominal: the stored peak of {measured['peak_flops'] / 1e9:.0f} GFLOP/s is "
                                     f"under {PLAUSIBLE_PEAK_SHARE:.0%} of the ISA's nominal figure, measured under "
                                     "load (dnnkit autotune measures again)"}
    return {**measured, "source": "measured"}


def ceilings_source(p) -> str:
    """What p's predicted times scale by, in words: its device's measured ceilings, nominal ones and why, or
    none (a GPU problem with no GPU)."""
    if p.device == "cuda":
        from ..backends import cuda as _cuda

        if _calibration("cuda")["ceilings"] is not None:
            return "measured"
        if _cuda.ceilings() is None:
            return "none: no GPU here, so no times are predicted"
        return "nominal: not measured on this GPU yet (dnnkit autotune measures them)"
    return ceilings()["source"]


def device_ceilings(p) -> Ceilings | None:
    """The ceilings the cost formulas scale by on p's device: on the CPU ceilings() and dnnkit's threads;
    on the GPU its FP32 rate and copy bandwidth as measured (measure_gpu_ceilings, kept in the cache under
    the GPU's fingerprint) and the TF32 rate scaled from the nominal by the measured FP32 over the
    nominal (the clock the SMs sustain), else its nominal FP32, TF32 and DRAM figures (backends/cuda.py);
    None where there are neither."""
    if p.device == "cuda":
        from ..backends import cuda as _cuda

        g = _cuda.ceilings()
        m = _calibration("cuda")["ceilings"]
        if m is None:
            return None if g is None else Ceilings(g["fp32_flops"], g["bytes_per_s"], 1, g["tf32_flops"])
        tf32 = g["tf32_flops"] * m["peak_flops"] / g["fp32_flops"] if g else 0.0
        return Ceilings(m["peak_flops"], m["copy_bytes_per_s"], 1, tf32)
    used = ceilings()
    return Ceilings(used["peak_flops"], used["copy_bytes_per_s"], get_num_threads())


def raw_predict(name: str, p) -> float | None:
    """The formula's seconds (Algorithm.cost) for the algorithm called name on p, before the fitted
    correction; None for a name the registry does not hold, a problem it does not support, or no formula."""
    from .. import algos

    backend = "cuda" if p.device == "cuda" else "cpu"
    for algo in algos.algorithms(p.op, backend):
        if algo.name == name:
            return _cost(algo, p)
    return None


def _cost(algo, p) -> float | None:
    if algo.supports(p) is not None:
        return None
    c = device_ceilings(p)
    return None if c is None else algo.cost(p, c)


def predict(algorithm, p) -> float | None:
    """Predicted seconds for algorithm on problem p (its cost() scaled by the factor fitted to this
    device's measurements), or None when it has no formula or cannot run p."""
    t = _cost(algorithm, p)
    if t is None:
        return None
    return t * correction(p, algorithm.name)


def correction(p, name: str) -> float:
    """The factor the formula of the algorithm called name is scaled by on p: the operator's scale times
    the algorithm's deviation from it on the measured problems most like p (see the module docstring)."""
    return fitted_correction(_calibration(_backend(p)), p, name)


def fitted_correction(fit: dict, p, name: str) -> float:
    """correction() under a given fit (fit_corrections' result)."""
    log_scale = fit["scale"].get(p.op, 0.0)
    local = fit["local"].get((p.op, name))
    if local is None:
        return math.exp(log_scale)
    kinds, sizes, logs = local
    kind, size = features(p)
    d2 = ((sizes - np.asarray(size)) ** 2).sum(axis=1)
    w = np.exp(d2 / (-2 * SIMILAR_LOG2 ** 2)) * np.where(kinds == hash(kind), 1.0, OTHER_KIND_WEIGHT)
    log_f = log_scale + float(w @ (logs - log_scale)) / (PRIOR_WEIGHT + float(w.sum()))
    return min(_CLAMP, max(1 / _CLAMP, math.exp(log_f)))


def correction_factors(backend: str = "cpu") -> dict:
    """{(op, algorithm): the median measured / predicted over its records} in the cache, for this device
    (the backend's) and version, where it has at least MIN_SAMPLES: what the fit has seen of each
    algorithm (predict scales by correction(), which weighs the records by their likeness to the problem)."""
    return dict(_calibration(backend)["factors"])


def features(p) -> tuple:
    """(kind, sizes) of a problem for the fit's likeness: records of another kind weigh OTHER_KIND_WEIGHT;
    sizes are log2 of the dimensions a formula's error follows."""
    from ..problem import ConvProblem, GemmProblem

    def lg(v):
        return math.log2(max(v, 1))

    if isinstance(p, ConvProblem):
        return ((p.kh, p.kw, p.sh, p.sw, p.dh, p.dw, p.g > 1, p.dtype),
                (lg(p.mb), lg(p.ic // p.g), lg(p.oc // p.g), lg(p.oh * p.ow)))
    if isinstance(p, GemmProblem):
        return ((p.trans_a, p.trans_b, p.packed, p.activation, p.dtype), (lg(p.m), lg(p.n), lg(p.k)))
    return ((p.mode, p.dirs, p.proj > 0, p.dtype),
            (lg(p.seq), lg(p.batch + 1), lg(p.input), lg(p.hidden), lg(p.layers)))


def _backend(p) -> str:
    return "cuda" if p.device == "cuda" else "cpu"


# The fits, per backend, kept between calls: the store and device it is for, the highest rowid read, and
# per problem key its (op, algorithm, measured / predicted) samples. A write adds or replaces rows, whose
# rowids are then above the last one read: only those are parsed again. Fewer rows than problems fitted (a
# cleared cache) means a fit from scratch.
_fits: dict = {}


def _calibration(backend: str = "cpu") -> dict:
    """Ceilings and correction factors for this device (the backend's: the CPU's, or the GPU's) and
    version, from the default cache, brought up to date when the cache changes (incrementally: only rows
    written since the last fit are read)."""
    from . import cache

    _fit = _fits.setdefault(backend, {"for": None, "top": 0, "samples": {}, "generation": None, "value": None})
    gen = generation()
    device, version = cache.device_fingerprint(backend), cache._version()
    # The store: default_store() never raises (a cache it cannot resolve or open is one in memory, with a
    # warning); the store object and its path say when the fit must start over.
    store = cache.default_store()
    target = (id(store), store.path, device, version)
    if _fit["for"] == target and _fit["generation"] == gen and _fit["value"] is not None:
        return _fit["value"]
    value = {"ceilings": None, "factors": {}, "scale": {}, "local": {}}
    if _fit["for"] != target:
        _fit.update({"for": target, "top": 0, "samples": {}})
    _fit["generation"], _fit["value"] = gen, value  # set first: the fit below calls the formulas
    try:
        value["ceilings"] = store.get_ceilings(device)
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
        value.update(fit_corrections(_fit["samples"].values()))
    except Exception as e:  # noqa: BLE001 - an unreadable cache means the uncorrected model, not a failure
        warnings.warn(f"dnnkit: cost model: could not read the tuning cache ({e}); using nominal values",
                      RuntimeWarning, stacklevel=3)
    return value


def fit_corrections(samples) -> dict:
    """The fit from the problems' samples (an iterable of lists of ((op, algorithm), measured / predicted,
    features(problem))): factors (per algorithm, the median ratio), scale (per operator, the log of the
    median ratio over all its algorithms) and local ((kinds, sizes, log ratios) arrays per algorithm)."""
    value: dict = {}
    per_algo: dict = {}
    per_op: dict = {}
    for rows in samples:
        for key, ratio, likeness in rows:
            per_algo.setdefault(key, []).append((ratio, likeness))
            per_op.setdefault(key[0], []).append(ratio)
    value["factors"] = {k: min(_CLAMP, max(1 / _CLAMP, float(statistics.median(r for r, _ in v))))
                        for k, v in per_algo.items() if len(v) >= MIN_SAMPLES}
    value["scale"] = {op: math.log(statistics.median(v)) for op, v in per_op.items() if len(v) >= MIN_SAMPLES}
    value["local"] = {k: (np.array([hash(f[0]) for _, f in v]), np.array([f[1] for _, f in v], dtype=float),
                          np.log([r for r, _ in v])) for k, v in per_algo.items()}
    return value


def _samples(cache, problem: str, records_json: str) -> list:
    """[((op, algorithm), measured / predicted, features(problem))] of one stored result; [] for a row
    this dnnkit cannot read (it is skipped, never fitted)."""
    import json

    from .records import TuneRecord

    try:
        p = cache.parse_problem_key(problem)
        records = [TuneRecord.from_dict(r) for r in json.loads(records_json)]
    except (ValueError, TypeError):
        return []
    out = []
    likeness = features(p)
    for r in records:
        t = raw_predict(r.algorithm, p) if r.ok else None
        ratio = r.median_s / t if t and r.median_s else 0.0
        if 0.0 < ratio < math.inf:  # (a hand-edited time can underflow or overflow it)
            out.append(((p.op, r.algorithm), ratio, likeness))
    return out


def measure_gpu_ceilings(store=None) -> dict:
    """Measure the GPU's float32 FMA rate and copy bandwidth (backends/cuda.py measure_ceilings, well under
    a second) and keep them in the cache under the GPU's fingerprint. Returns the figures."""
    from ..backends import cuda as _cuda
    from . import cache

    m = _cuda.measure_ceilings()
    (store or cache.default_store()).put_ceilings(m["fp32_flops"], m["bytes_per_s"],
                                                  device=cache.device_fingerprint("cuda"))
    return m


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
