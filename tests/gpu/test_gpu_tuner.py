"""The tuner on the GPU: every GPU algorithm that supports a problem is checked against the float64
reference on device operands and timed by the CUDA backend's timer (here a fake one: the simulator's
times say nothing), the fastest is stored under the GPU's fingerprint, and dispatch then takes it."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

import dnnkit  # noqa: E402
from dnnkit.autotune import tuner  # noqa: E402
from dnnkit.backends import cuda as cuda_backend  # noqa: E402
from dnnkit.problem import GemmProblem, RnnProblem  # noqa: E402
from gpu_helpers import dev, host  # noqa: E402


def test_tuner_times_every_gpu_algorithm_and_dispatch_takes_the_fastest(monkeypatch):
    fake = {"gemm_tiled_32x32": 3e-3, "gemm_tiled_64x64": 2e-3, "gemm_tiled_128x128": 1e-3}
    calls = []

    def fake_time_call(fn, stream=None):
        # which algorithm fn runs: the closure's `a`
        algo = fn.__closure__[[c for c in fn.__code__.co_freevars].index("a")].cell_contents
        calls.append(algo.name)
        return fake[algo.name]

    monkeypatch.setattr(cuda_backend, "time_call", fake_time_call)
    p = GemmProblem(9, 7, 13, trans_b=True, bias=True, activation="relu", device="cuda")
    result = tuner.find(p, budget=0.01)
    by = {r.algorithm: r for r in result}
    assert set(calls) == set(fake)
    assert by["gemm_splitk"].status == "unsupported"
    for name in fake:
        assert by[name].status == "ok" and by[name].error <= 1e-6, by[name]
    assert result.best.algorithm == "gemm_tiled_128x128"
    # dispatch reads the cache: the tuned choice, though the rules would take another here
    rng = np.random.default_rng(0)
    x, w, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((9, 13), (7, 13), (7,)))
    e = dnnkit.explain("linear", dev(x), dev(w), dev(b), activation="relu")
    assert [c.algorithm for c in e if c.chosen] == ["gemm_tiled_128x128"]
    y = dnnkit.linear(dev(x), dev(w), dev(b), activation="relu")
    assert np.allclose(host(y), np.maximum(x @ w.T + b, 0), atol=1e-5)


def test_tuner_times_the_gpu_rnn_algorithms(monkeypatch):
    """The sequences on the GPU are tunable: every algorithm of the forward (gpu_steps, gpu_persistent,
    gpu_wavefront) checked on device operands and timed (none pruned: the GPU formulas are not fitted
    here), the fastest taken by dispatch; the backward's operands a training forward's outputs and saves,
    made on the device."""
    fake = {"gpu_steps": 3e-3, "gpu_persistent": 1e-3, "gpu_wavefront": 2e-3}

    def fake_time_call(fn, stream=None):
        algo = fn.__closure__[[c for c in fn.__code__.co_freevars].index("a")].cell_contents
        return fake[algo.name]

    monkeypatch.setattr(cuda_backend, "time_call", fake_time_call)
    monkeypatch.setattr(cuda_backend, "last_level_cache_bytes", lambda: 0)  # one operand set (the simulator is slow)
    monkeypatch.setattr(tuner, "MIN_REPS", 1)
    # predictions far apart: nothing is pruned on the GPU before its formulas are fitted on this device
    predicted = {"gpu_steps": 1.0, "gpu_persistent": 0.01, "gpu_wavefront": 0.02}
    monkeypatch.setattr(tuner, "predict", lambda a, p: predicted[a.name])
    p = RnnProblem("gru", 2, 2, 3, 4, layers=2, device="cuda")
    result = tuner.find(p, budget=0.01)
    by = {r.algorithm: r for r in result}
    for name in fake:
        assert by[name].status == "ok" and by[name].error <= 1e-6, by[name]
    assert result.best.algorithm == "gpu_persistent"
    e = dnnkit.explain(p)
    assert [c.algorithm for c in e if c.chosen] == ["gpu_persistent"]
    back = tuner.find(RnnProblem("lstm", 2, 2, 3, 4, dirs=2, direction="bwd", device="cuda"), budget=0.01)
    assert [(r.algorithm, r.status) for r in back] == [("gpu_steps", "ok")] and back.best.error <= 1e-6


def test_gpu_ceilings_are_measured_once_and_scale_the_formulas(monkeypatch, tmp_path):
    """measure_ceilings runs the FMA probe and a device copy (here at toy sizes: the simulator's rates mean
    nothing); measure_gpu_ceilings keeps them under the GPU's fingerprint, and the GPU formulas scale by
    them from then on."""
    from dnnkit.autotune import cache, cost_model

    got = cuda_backend.measure_ceilings(seconds=0.0, copy_bytes=4096, repeats=1)
    assert got["fp32_flops"] > 0 and got["bytes_per_s"] > 0
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_backend, "measure_ceilings", lambda: {"fp32_flops": 5e13, "bytes_per_s": 3e12})
    p = GemmProblem(64, 64, 64, device="cuda")
    cost_model.measure_gpu_ceilings()
    assert cache.default_store().get_ceilings(cache.device_fingerprint("cuda")) == {"peak_flops": 5e13,
                                                                                    "copy_bytes_per_s": 3e12}
    c = cost_model.device_ceilings(p)
    assert (c.peak_flops, c.bytes_per_s) == (5e13, 3e12)
    assert cache.default_store().get_ceilings() is None  # the CPU's are its own
