"""Each algorithm's cost() formula (next to its code): every registered algorithm, CPU and GPU, states
one; the formulas scale with the ceilings; where an operator's rules partition its problems (the GEMMs,
the RNN schedules), untuned dispatch follows the rules whatever the model or its fitted corrections say."""
from __future__ import annotations

import itertools
import math

import pytest

import dnnkit
from dnnkit import algos
from dnnkit.algos import gemm_cpu, gemm_cuda
from dnnkit.algos.base import Ceilings
from dnnkit.autotune import cost_model
from dnnkit.dispatch import candidates, choose
from dnnkit.problem import ConvProblem, GemmProblem, RnnProblem
from helpers import run_each_operator

CPU = Ceilings(peak_flops=200e9, bytes_per_s=10e9, threads=2)
GPU = Ceilings(peak_flops=60e12, bytes_per_s=3e12, threads=1, tf32_flops=400e12)

GEMMS = [(1, 1000, 2048), (4, 256, 512), (13, 512, 1024), (48, 1024, 1024), (512, 512, 512), (3, 5, 7),
         (3136, 64, 576), (1, 4096, 4096), (64, 64, 8192)]
CONVS = ["mb8ic64ih56oc64oh56kh3ph1", "mb1ic256ih14oc256oh14kh3ph1", "mb8ic256ih56oc64oh56kh1ph0",
         "mb2ic32ih28oc32oh28kh5ph2", "g32mb2ic32ih28oc32oh28kh3ph1", "mb2ic16ih9oc8oh4kh3sh2ph0"]


def _untuned_choices(problems) -> list:
    """The algorithm each problem takes with tuning off (the rules, then the formulas; no cache)."""
    dnnkit.set_tuning("off")
    try:
        return [choose(p).name for p in problems]
    finally:
        dnnkit.set_tuning("heuristic")


def _rnns(device="cpu"):
    for mode, direction in itertools.product(("lstm", "gru", "rnn_tanh", "rnn_relu"), ("fwd", "bwd")):
        yield RnnProblem(mode, 25, 16, 256, 512, layers=2, dirs=2, direction=direction, device=device)
        yield RnnProblem(mode, 50, 8, 128, 128, layers=3, direction=direction, device=device)
        yield RnnProblem(mode, 1, 4, 64, 32, direction=direction, device=device)  # a cell
    yield RnnProblem("lstm", 10, 4, 64, 128, proj=32, direction="fwd", device=device)


def _problems(device):
    for m, n, k in GEMMS:
        for tb in (False, True):
            yield GemmProblem(m, n, k, trans_b=tb, device=device)
    yield GemmProblem(64, 64, 256, dtype="float64", device=device)
    if device == "cpu":
        yield GemmProblem(64, 256, 512, trans_b=True, packed=True)  # a weight packed by pack_weight
        for d in CONVS:
            for direction in ("fwd", "bwd_data", "bwd_filter"):
                yield ConvProblem.parse(d, direction=direction)
    yield from _rnns(device)


@pytest.mark.parametrize("device, ceilings", [("cpu", CPU), ("cuda", GPU)])
def test_every_algorithm_states_a_cost(device, ceilings):
    """Every registered algorithm, on every problem of its operator it supports, predicts a finite positive
    time; and every algorithm is reached by some problem here."""
    reached = set()
    for p in _problems(device):
        for a in algos.algorithms(p.op, device):
            if a.supports(p) is None:
                t = a.cost(p, ceilings)
                assert t is not None and math.isfinite(t) and t > 0, (a, p.descriptor(), t)
                reached.add((a.op, a.name))
    registered = {(a.op, a.name) for a in algos.all_algorithms() if a.backend == device}
    # the AMX tiles' paths where this CPU has none: their formulas all the same
    unreached = registered - reached
    tiles = {("gemm", "gemm_amx")} | {(f"{m}_fwd", "fused_amx") for m in ("lstm", "gru", "rnn_tanh", "rnn_relu")}
    assert unreached <= tiles
    for op, name in unreached:
        p = GemmProblem(512, 512, 512) if op == "gemm" else RnnProblem(op[:-4], 10, 64, 256, 256)
        t = algos.get(op, device, name).cost(p, ceilings)
        assert math.isfinite(t) and t > 0


@pytest.mark.parametrize("device, ceilings", [("cpu", CPU), ("cuda", GPU)])
def test_costs_scale_with_the_ceilings(device, ceilings):
    """A device twice as fast in arithmetic and bandwidth runs everything faster, in half the time but for
    the fixed costs (a GPU launch, a barrier among threads)."""
    double = Ceilings(ceilings.peak_flops * 2, ceilings.bytes_per_s * 2, ceilings.threads, ceilings.tf32_flops * 2)
    for p in _problems(device):
        for a in algos.algorithms(p.op, device):
            if a.supports(p) is None:
                t1, t2 = a.cost(p, ceilings), a.cost(p, double)
                assert t1 / 2 * (1 - 1e-9) <= t2 < t1, (a, p.descriptor())


def test_the_gpu_formulas_see_the_waves_and_the_split_depth(monkeypatch):
    monkeypatch.setattr(gemm_cuda, "sm_count", lambda: 132)
    big = algos.get("gemm", "cuda", "gemm_tiled_128x128")
    full = GemmProblem(12 * 128, 11 * 128, 4096, device="cuda")  # 132 tiles: one wave
    over = GemmProblem(12 * 128, 11 * 128 + 1, 4096, device="cuda")  # 144 tiles: a second wave for 12
    launch = gemm_cuda.LAUNCH_S
    assert big.cost(over, GPU) - launch == pytest.approx(2 * (big.cost(full, GPU) - launch), rel=1e-6)
    narrow = GemmProblem(64, 64, 1 << 16, device="cuda")
    assert (algos.get("gemm", "cuda", "gemm_splitk").cost(narrow, GPU)
            < algos.get("gemm", "cuda", "gemm_tiled_64x64").cost(narrow, GPU) / 10)
    assert algos.get("gemm", "cuda", "gemm_tf32").cost(full, GPU) < big.cost(full, GPU)
    assert algos.get("gemm", "cuda", "gemm_tf32").cost(full, Ceilings(60e12, 3e12)) is None  # no tensor cores


def _ruled(p):
    return [a.name for a, reason, _ in candidates(p) if reason is None and a.rule(p) is None]


GRID = list(itertools.product([1, 2, 4, 8, 10, 12, 13, 16, 17, 20, 24, 32, 48, 64, 128, 3136],
                              [16, 256, 1000, 4096], [8, 256, 576, 2048], [False, True]))


@pytest.mark.parametrize("width", ["this ISA", 16])
def test_the_cpu_gemm_rules_partition_the_products(width, monkeypatch):
    """Exactly one CPU GEMM algorithm's rule takes each product (also with AVX-512's 16-row strided-A tile,
    where gemm_small_m's rule asks gemm_wt_direct's)."""
    if width != "this ISA":
        monkeypatch.setattr(gemm_cpu._cpu, "gemm_wt_direct_width", lambda itemsize, rows: width)
        monkeypatch.setattr(gemm_cpu._cpu, "gemm_wt_direct_fits", lambda itemsize, rows: rows % width >= 0.6 * width or rows % width == 0)
    for m, n, k, tb in GRID:
        assert len(_ruled(GemmProblem(m, n, k, trans_b=tb))) == 1, (m, n, k, tb)


def test_the_gpu_gemm_rules_partition_the_products(monkeypatch):
    """Exactly one GPU tile kernel's rule takes each product, or it and split-K (which a workspace limit
    may deny); with TF32 allowed, gemm_tf32 every float32 one."""
    monkeypatch.setattr(gemm_cuda, "sm_count", lambda: 132)
    for (m, n, k, tb), tf32 in itertools.product(GRID, (False, True)):
        dnnkit.set_allow_tf32(tf32)
        try:
            ruled = _ruled(GemmProblem(m, n, k, trans_b=tb, device="cuda"))
        finally:
            dnnkit.set_allow_tf32(False)
        assert ruled == ["gemm_tf32"] if tf32 else len([r for r in ruled if r != "gemm_splitk"]) == 1, (m, n, k, ruled)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_rules_decide_whatever_the_fitted_corrections_say(device, monkeypatch):
    """Corrections fitted to a cache that make the ruled algorithm look 64x slower than the rest change no
    untuned choice where one rule takes the problem; explain() still shows the predictions."""
    monkeypatch.setattr(gemm_cuda, "sm_count", lambda: 132)
    if device == "cuda":
        monkeypatch.setattr(cost_model, "device_ceilings", lambda p: GPU)
    problems = [GemmProblem(m, n, k, trans_b=tb, device=device) for m, n, k, tb in GRID[::7]]
    problems += list(_rnns(device))
    problems = [p for p in problems if len(_ruled(p)) == 1]  # (not split-K beside the 32x32 tile)
    assert len(problems) > 20
    expected = _untuned_choices(problems)
    for p, name in zip(problems, expected):
        factors = {(p.op, a.name): (8.0 if a.name == name else 1 / 8) for a in algos.algorithms(p.op, device)}
        monkeypatch.setattr(cost_model, "correction", lambda p, name, factors=factors: factors[(p.op, name)])
        dnnkit.dispatch._plans.clear()
        assert choose(p).name == name, p.descriptor()
        rows = dnnkit.explain(p)
        assert all(r.predicted_s is not None for r in rows if r.supported), p.descriptor()
    dnnkit.dispatch._plans.clear()


def test_the_nominal_peak_follows_the_cores_fma_datapath(monkeypatch):
    from dnnkit.backends import cpu

    assert cpu.fma_datapath_bits() in (128, 256, 512)
    for bits, avx2, avx512 in ((128, 16, 16), (256, 32, 32), (512, 32, 64)):  # Zen+, Zen 4, Zen 5 / Intel
        monkeypatch.setattr(cpu, "fma_datapath_bits", lambda bits=bits: bits)
        assert (cpu.flops_per_cycle("avx2"), cpu.flops_per_cycle("avx512"), cpu.flops_per_cycle("ref")) == \
            (avx2, avx512, 4)
    monkeypatch.setattr(cpu, "fma_datapath_bits", lambda: 128)
    assert cpu.nominal_peak_flops() == pytest.approx(
        cpu.flops_per_cycle(cpu.active_isa()) * 2.5e9 * dnnkit.get_num_threads())


def test_the_nominal_copy_rate_follows_the_cores_fma_datapath(monkeypatch):
    """Until measured, a thread's copy bandwidth is the one measured on cores of the same FMA datapath (the
    ceilings' nominal figure): more on wider cores, 10 GB/s on others."""
    from dnnkit.backends import cpu

    rates = []
    for bits in (128, 256, 512, 64):
        monkeypatch.setattr(cpu, "fma_datapath_bits", lambda bits=bits: bits)
        rates.append(cpu.nominal_copy_bytes_per_s())
    assert rates[0] < rates[1] < rates[2] and rates[3] == 10e9
    monkeypatch.setattr(cost_model, "_calibration", lambda *a: {"ceilings": None})
    assert cost_model.ceilings()["copy_bytes_per_s"] == 10e9


def test_the_fit_reads_rnn_records_and_the_rules_still_decide(store):
    """RNN results in the cache are fitted like the others (their keys parse back): each schedule's factor
    is its measured / predicted; and untuned RNN problems are still decided by the rules."""
    from dnnkit import _config
    from dnnkit.autotune.records import TuneRecord, TuneResult

    stored = [RnnProblem(mode, t, b, 16, 32, direction=d) for mode in ("lstm", "gru") for d in ("fwd", "bwd")
              for t, b in ((3, 2), (5, 4))]
    for p in stored:
        records = []
        for a in algos.algorithms(p.op, "cpu"):
            t = cost_model.raw_predict(a.name, p)
            if t is not None:
                records.append(TuneRecord(a.name, "ok", median_s=2.0 * t, workspace_bytes=0))
        assert len(records) >= 2, p.descriptor()
        store.put(TuneResult(p, sorted(records, key=lambda r: r.median_s), 0.1))
    _config.changed()
    factors = cost_model.correction_factors("cpu")
    for op in ("lstm_fwd", "lstm_bwd", "gru_fwd", "gru_bwd"):
        fitted = {name: f for (o, name), f in factors.items() if o == op}
        assert fitted and all(f == pytest.approx(2.0) for f in fitted.values()), (op, fitted)
    problems = [p for p in _rnns("cpu") if len(_ruled(p)) == 1]
    expected = _untuned_choices(problems)
    for p, name in zip(problems, expected):
        assert choose(p).name == name, p.descriptor()
        t = cost_model.predict(algos.get(p.op, "cpu", name), p)
        assert t is not None and math.isfinite(t) and t > 0


@pytest.mark.parametrize("column, value", [("copy_bytes_per_s", 0), ("copy_bytes_per_s", -1.0),
                                           ("peak_flops", "abc"), ("peak_flops", float("inf")),
                                           ("copy_bytes_per_s", b"\x00")])
def test_stored_ceilings_that_are_not_positive_finite_numbers_count_as_absent(store, column, value):
    """A ceilings row written behind dnnkit's back with a zero, a negative, an infinite or a non-number:
    ignored with one warning (nominal values), and gemm, conv2d, lstm and explain keep working."""
    import sqlite3
    import warnings

    from dnnkit import _config
    from dnnkit.autotune import cache

    store.put_ceilings(1e12, 1e10)
    conn = sqlite3.connect(store.path)
    conn.execute(f"UPDATE ceilings SET {column} = ?", (value,))
    conn.commit()
    conn.close()
    _config.changed()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            run_each_operator(5)
            assert len(dnnkit.explain("mb1ic2ih5oc3kh3")) > 0
            used = cost_model.ceilings()
            assert used["source"].startswith("nominal") and used["peak_flops"] == cost_model.nominal_peak_flops()
            _config.changed()
    messages = [str(w.message) for w in caught]
    assert sum("not positive finite numbers" in m for m in messages) == 1, messages
    assert store.get_ceilings() is None and store.get_ceilings(cache.device_fingerprint()) is None
    with pytest.raises(ValueError, match="put_ceilings: copy_bytes_per_s"):
        store.put_ceilings(1e12, 0.0)
    store.put_ceilings(1e12, 1e10)  # measured again: used
    assert store.get_ceilings() == {"peak_flops": 1e12, "copy_bytes_per_s": 1e10}
