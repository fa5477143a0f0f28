"""The autotuner: find() (timing, accuracy check, failures, workspace limit, pruning), measure mode,
dispatch's precedence (explicit algo > cached result > mode) and the cost model's fit from the cache."""
from __future__ import annotations

import math

import numpy as np
import pytest

import dnnkit
from dnnkit import algos
from dnnkit.algos.conv_cpu import Im2colGemmFwd
from dnnkit.autotune import cache, cost_model, harness, tuner
from dnnkit.autotune.tuner import TuneRecord, TuneResult, find
from dnnkit.dispatch import choose
from dnnkit.problem import ConvProblem, GemmProblem, RnnProblem

SMALL_CONV = "mb2ic8ih12oc8oh12kh3ph1"
QUICK = dict(budget=0.02)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache directory of the test's own."""
    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    yield cache.default_store()
    cache.default_store().close()


class _Planted(Im2colGemmFwd):
    """im2col_gemm under another name, with a fault planted: noise, an exception, or a large workspace."""

    def __init__(self, name, *, noise=0.0, fail=None, workspace=None):
        self.name, self.noise, self.fail, self.workspace, self.runs = name, noise, fail, workspace, 0

    def workspace_bytes(self, p):
        return super().workspace_bytes(p) if self.workspace is None else self.workspace

    def run(self, p, a0, a1, *, out, bias=None, workspace=None):
        self.runs += 1
        if self.fail is not None:
            raise self.fail
        super().run(p, a0, a1, out=out, bias=bias, workspace=workspace)
        if self.noise:
            out += self.noise * np.abs(out).max()
        return out


@pytest.fixture
def planted():
    added = []

    def plant(algo):
        algos.register(algo)
        added.append(algo)
        return algo

    yield plant
    for a in added:
        algos.unregister(a)


def test_find_times_every_supporting_algorithm_best_first(fresh_cache):
    p = ConvProblem.parse(SMALL_CONV)
    result = find(p, prune=None, **QUICK)
    names = {a.name for a in algos.algorithms(p.op, "cpu")}
    assert {r.algorithm for r in result} == names
    ok = [r for r in result if r.ok]
    supporting = [a for a in algos.algorithms(p.op, "cpu") if a.supports(p) is None]
    assert len(supporting) >= 4 and len(ok) == len(supporting)
    assert all(r.status == "unsupported" for r in result if not r.ok)
    assert result[0] is result.best
    assert [r.median_s for r in ok] == sorted(r.median_s for r in ok)
    for r in ok:
        assert r.reps >= tuner.MIN_REPS and r.median_s > 0 and r.spread >= 0
        assert r.error is not None and r.error <= r.tolerance
        assert r.gflops == pytest.approx(p.flops / r.median_s / 1e9)
        assert r.workspace_bytes == algos.get(p.op, "cpu", r.algorithm).workspace_bytes(p)
    stored = fresh_cache.get(p)
    assert stored is not None and [r.algorithm for r in stored] == [r.algorithm for r in result]
    assert stored.source == "cache"


@pytest.mark.parametrize("direction", ["bwd_data", "bwd_filter"])
def test_find_backward_directions(direction, fresh_cache):
    p = ConvProblem.parse("mb2ic4ih9oc6oh5kh3sh2ph1", direction=direction)
    result = find(p, store=False, prune=None, **QUICK)  # every algorithm timed, none pruned
    assert result.best is not None
    supporting = [a.name for a in algos.algorithms(p.op, "cpu") if a.supports(p) is None]
    assert len(supporting) >= 2
    assert sorted(r.algorithm for r in result if r.ok) == sorted(supporting)
    assert all(r.status == "unsupported" for r in result if not r.ok)  # stride 2: Winograd's backward data


def test_find_gemm_and_unsupported_reason(fresh_cache):
    """The tuner times every algorithm that can run a product, those whose rule would not take it too
    (gemm_small_m at 40 rows); one that cannot run it (a layout it does not take) says why."""
    p = GemmProblem(40, 24, 16, trans_b=True, bias=True, activation="relu")
    assert algos.get("gemm", "cpu", "gemm_small_m").rule(p) is not None
    result = find(p, store=False, **QUICK)
    by_name = {r.algorithm: r for r in result}
    assert by_name["blocked_gemm"].ok and by_name["gemm_small_m"].ok
    result = find(GemmProblem(40, 24, 16), store=False, **QUICK)
    by_name = {r.algorithm: r for r in result}
    assert by_name["gemm_small_m"].status == "unsupported" and "op(b) = b.T" in by_name["gemm_small_m"].reason
    assert result[-1].status == "unsupported"


def test_inputs_are_random_not_zeros():
    ops = harness.operands(ConvProblem.parse(SMALL_CONV), np.random.default_rng(0))
    for a in ops.args:
        assert np.count_nonzero(a) == a.size and a.std() > 0.3


def test_the_tuner_takes_a_large_workspace_where_the_operator_does():
    """A tuner's call gets its workspace as conv2d's does (backends/cpu.py workspace: from the block cache
    above recycle_bytes), so the timing never counts the page faults of a fresh mapping a real call does not
    take; the block goes back to the cache after the call."""
    from dnnkit.backends import cpu

    p = ConvProblem.parse("mb1ic512ih7oc512oh7kh3ph1", direction="bwd_filter")
    nbytes = algos.get("conv2d_bwd_filter", "cpu", "winograd_f4x4_3x3").workspace_bytes(p)
    assert nbytes >= cpu.recycle_bytes
    seen = []

    class Spy:
        def run(self, p, *args, out, workspace=None, **kwargs):
            seen.append((workspace.dtype, workspace.nbytes))

    h = harness.harness(p)
    ops = h.operands(p, np.random.default_rng(0))
    dnnkit.empty_cache()
    h.run(Spy(), p, ops, h.output(p, ops), nbytes)
    assert seen == [(np.dtype(np.float32), nbytes)]
    assert cpu.block_cache_bytes() >= nbytes
    dnnkit.empty_cache()


def test_an_inaccurate_candidate_is_excluded(planted, fresh_cache):
    bad = planted(_Planted("planted_noisy", noise=1e-2))
    p = ConvProblem.parse(SMALL_CONV)
    result = find(p, prune=None, **QUICK)  # timed whatever the model predicts of im2col_gemm's clone
    rec = next(r for r in result if r.algorithm == bad.name)
    assert rec.status == "inaccurate" and rec.error > rec.tolerance and "tolerance" in rec.reason
    assert math.isinf(rec.median_s)
    assert result.best.algorithm != bad.name
    assert choose(p).name != bad.name  # the cached result never names it


@pytest.mark.parametrize("error", [RuntimeError("kernel exploded"), MemoryError("no memory")])
def test_a_failing_candidate_does_not_stop_tuning(error, planted, fresh_cache):
    bad = planted(_Planted("planted_failing", fail=error))
    p = ConvProblem.parse(SMALL_CONV)
    result = find(p, prune=None, **QUICK)
    rec = next(r for r in result if r.algorithm == bad.name)
    assert rec.status == "failed" and type(error).__name__ in rec.reason and str(error) in rec.reason
    assert result.best is not None and result.best.algorithm != bad.name
    assert sum(r.ok for r in result) >= 3


def test_workspace_limit_excludes_without_running(planted, fresh_cache):
    big = planted(_Planted("planted_big", workspace=1 << 40))
    p = ConvProblem.parse(SMALL_CONV)
    limit = 1 << 20
    result = find(p, workspace_limit=limit, **QUICK)
    rec = next(r for r in result if r.algorithm == big.name)
    assert rec.status == "over_limit" and big.runs == 0 and "over the limit" in rec.reason
    for r in result:
        if r.ok:
            assert r.workspace_bytes <= limit


def test_pruning_skips_what_the_model_rules_out(fresh_cache):
    p = ConvProblem.parse("mb2ic64ih14oc64oh14kh1ph0")  # 1x1: im2col_gemm reads the input directly
    pruned = find(p, store=False, **QUICK)
    assert any(r.status == "pruned" and "best prediction" in r.reason for r in pruned)
    timed = find(p, store=False, prune=None, **QUICK)
    assert not any(r.status == "pruned" for r in timed)


def test_find_rejects_bad_arguments():
    p = ConvProblem.parse(SMALL_CONV)
    with pytest.raises(ValueError, match="budget"):
        find(p, budget=-1, store=False)
    with pytest.raises(ValueError, match="prune"):
        find(p, prune=0.5, store=False)
    with pytest.raises(ValueError, match="no cuda algorithm"):
        find(ConvProblem.parse(SMALL_CONV, device="cuda"), store=False)


def test_record_round_trip():
    r = TuneRecord("x", "failed", reason="boom")
    assert TuneRecord.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError):
        TuneRecord.from_dict({"algorithm": "x", "status": "excellent"})


# ------------------------------------------------------------------------------------ dispatch and modes
def _fake_result(p, fastest: str, workspace=0, others=()):
    recs = [TuneRecord(fastest, "ok", median_s=1e-3, workspace_bytes=workspace)]
    recs += [TuneRecord(n, "ok", median_s=2e-3, workspace_bytes=0) for n in others]
    return TuneResult(p, recs, 0.1)


@pytest.mark.parametrize("mode", ["off", "heuristic", "measure"])
def test_a_cached_result_beats_the_mode(mode, fresh_cache):
    dnnkit.set_tuning(mode)
    p = ConvProblem.parse(SMALL_CONV)
    fresh_cache.put(_fake_result(p, "direct"))
    assert choose(p).name == "direct"
    assert choose(p, "im2col_gemm").name == "im2col_gemm"  # an explicit algo beats the cache


def test_a_cached_result_over_the_workspace_limit_is_passed_over(fresh_cache):
    p = ConvProblem.parse(SMALL_CONV)
    fresh_cache.put(_fake_result(p, "winograd_f2x2_3x3", workspace=1 << 30, others=["direct"]))
    assert choose(p).name == "winograd_f2x2_3x3"
    assert choose(p, workspace_limit=1 << 20).name == "direct"


def test_a_cached_result_naming_an_unknown_algorithm_is_ignored(fresh_cache):
    dnnkit.set_tuning("off")
    p = ConvProblem.parse(SMALL_CONV)
    fresh_cache.put(_fake_result(p, "removed_long_ago"))
    assert choose(p).name == algos.algorithms(p.op, "cpu")[0].name


def test_measure_mode_tunes_on_the_first_call_and_remembers(fresh_cache, monkeypatch):
    monkeypatch.setattr(tuner, "DEFAULT_BUDGET_S", 0.02)
    dnnkit.set_tuning("measure")
    x = np.random.default_rng(1).standard_normal((1, 3, 10, 10), dtype=np.float32)
    w = np.random.default_rng(2).standard_normal((5, 3, 3, 3), dtype=np.float32)
    p = ConvProblem.from_arrays(x.shape, w.shape, 1, 1, 1, 1)
    assert fresh_cache.get(p) is None
    y = dnnkit.conv2d(x, w, padding=1)
    stored = fresh_cache.get(p)
    assert stored is not None and stored.best is not None
    assert choose(p).name == stored.best.algorithm
    np.testing.assert_allclose(y, dnnkit.conv2d(x, w, padding=1, algo="im2col_gemm"), rtol=1e-4, atol=1e-4)


RNN_CASES = ["lstm_l2t5mb8slc6sic12", "gru_l1t4mb8slc5sic7_bidir", "lstm_l1t4mb8slc6sic12dic5", "rnn_relu_l2t3mb4slc3sic5"]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("descriptor", RNN_CASES)
def test_rnn_sequences_are_tuned_over_every_schedule(fresh_cache, descriptor, direction):
    """Every time-loop schedule that can run a sequence is checked against reference.py's float64
    recurrence (backward: the input, initial-state and weight gradients) and timed; those that cannot
    run it say why."""
    p = RnnProblem.parse(descriptor, direction=direction)
    result = find(p, store=False, **QUICK)
    by_name = {r.algorithm: r for r in result}
    assert set(by_name) == {a.name for a in algos.algorithms(p.op, "cpu")}
    assert by_name["fused"].ok and by_name["fused_units"].ok
    for r in result:
        if r.ok:
            assert r.error is not None and r.error <= r.tolerance and r.median_s > 0, r
        else:
            assert r.status == "unsupported" and r.reason, r
    assert result.best is not None


def test_an_rnn_schedule_with_wrong_results_is_excluded(planted, fresh_cache):
    """The oracle is independent of the kernels: a schedule whose results are off is caught."""
    from dnnkit.algos.rnn_cpu import FusedRnn

    class Off(FusedRnn):
        def run(self, p, *arrays, out=None, **params):
            super().run(p, *arrays, out=out, **params)
            out[-1][0, 0, 0] += 1.0

    bad = Off("lstm", "fwd", "fused_units")
    bad.name = "planted_rnn_off"
    planted(bad)
    result = find(RnnProblem.parse("lstm_l1t4mb4slc3sic5"), store=False, **QUICK)
    rec = next(r for r in result if r.algorithm == bad.name)
    assert rec.status == "inaccurate" and rec.error > rec.tolerance


def test_measure_mode_tunes_rnn_sequences_without_a_warning(fresh_cache, monkeypatch):
    import warnings

    monkeypatch.setattr(tuner, "DEFAULT_BUDGET_S", 0.02)
    dnnkit.set_tuning("measure")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 8, 4), dtype=np.float32)
    w = [rng.standard_normal(s, dtype=np.float32) * 0.3 for s in ((18, 4), (18, 6), (18,), (18,))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, h_n, reserve = dnnkit.gru(x, None, w, train=True)
        dnnkit.gru_backward(np.ones_like(out), None, reserve)
    for direction in ("fwd", "bwd"):
        p = RnnProblem("gru", 5, 8, 4, 6, direction=direction)
        stored = fresh_cache.get(p)
        assert stored is not None and stored.best is not None
        assert choose(p).name == stored.best.algorithm


def test_explain_shows_measured_times(fresh_cache):
    p = ConvProblem.parse(SMALL_CONV)
    fresh_cache.put(_fake_result(p, "direct"))
    rows = {c.algorithm: c for c in dnnkit.explain(p)}
    assert rows["direct"].measured_s == pytest.approx(1e-3) and rows["direct"].chosen
    assert "measured 1.000 ms" in str(dnnkit.explain(p))


def test_explain_says_which_ceilings_its_predictions_scale_by(fresh_cache):
    """Nominal ceilings until this device's are measured (and why), then the measured ones; the explanation
    reads the cache as it is when asked."""
    p = ConvProblem.parse(SMALL_CONV)
    shown = str(dnnkit.explain(p)).splitlines()
    assert ("  predicted times: nominal ceilings, not measured on this device yet (dnnkit autotune measures them)"
            in shown)
    fresh_cache.put_ceilings(1.1 * cost_model.nominal_peak_flops(), 20e9)
    assert dnnkit.explain(p).ceilings == "measured"
    assert "  predicted times: this device's measured ceilings" in str(dnnkit.explain(p)).splitlines()
    fresh_cache.put_ceilings(0.05 * cost_model.nominal_peak_flops(), 20e9)  # taken under load: not used
    assert "nominal ceilings, the stored peak of" in str(dnnkit.explain(p))
    # A GPU problem: the GPU's nominal figures, or none where there is no GPU (and then no predictions).
    from dnnkit.backends import cuda

    gpu = dnnkit.explain(GemmProblem(64, 64, 64, device="cuda"))
    if cuda.ceilings() is None:
        assert "  predicted times: no GPU here, so no times are predicted" in str(gpu).splitlines()
        assert all(c.predicted_s is None for c in gpu)
    else:
        assert "  predicted times: nominal ceilings, not measured on this GPU yet" in str(gpu)


# ----------------------------------------------------------------------------------------- cost model
def test_cost_model_fits_correction_factors_from_the_cache(fresh_cache):
    algo = algos.get("conv2d_fwd", "cpu", "im2col_gemm")
    layers = ["mb8ic64ih56oc64oh56kh3ph1", "mb8ic128ih28oc128oh28kh3ph1", "mb8ic256ih14oc256oh14kh3ph1"]
    before = {d: cost_model.predict(algo, ConvProblem.parse(d)) for d in layers}
    for d in layers:
        p = ConvProblem.parse(d)
        fresh_cache.put(TuneResult(p, [TuneRecord(algo.name, "ok", median_s=3 * cost_model.raw_predict(algo.name, p))]))
    assert cost_model.correction_factors()[("conv2d_fwd", "im2col_gemm")] == pytest.approx(3.0)
    for d in layers:
        assert cost_model.predict(algo, ConvProblem.parse(d)) == pytest.approx(3 * before[d])
    # An algorithm without records takes the operator's scale: the formulas' ranking is kept.
    other = algos.get("conv2d_fwd", "cpu", "direct")
    p = ConvProblem.parse(layers[0])
    assert cost_model.predict(other, p) == pytest.approx(3 * cost_model.raw_predict("direct", p))


def test_an_algorithm_is_corrected_by_its_records_on_problems_like_the_one_asked(fresh_cache):
    """direct measured 4x faster than its formula on 1x1 layers and as predicted on 3x3 ones (im2col_gemm as
    predicted everywhere): a new 1x1 layer is corrected by the 1x1 records, a new 3x3 layer by the 3x3
    ones, and a layer of another kind and far sizes is left near the formula."""
    direct, im2col = (algos.get("conv2d_fwd", "cpu", n) for n in ("direct", "im2col_gemm"))
    measured = {"mb8ic64ih56oc256oh56kh1ph0": 0.25, "mb8ic256ih56oc64oh56kh1ph0": 0.25,
                "mb8ic128ih28oc512oh28kh1ph0": 0.25, "mb8ic64ih56oc64oh56kh3ph1": 1.0,
                "mb8ic128ih28oc128oh28kh3ph1": 1.0, "mb8ic256ih14oc256oh14kh3ph1": 1.0}
    for d, ratio in measured.items():
        p = ConvProblem.parse(d)
        fresh_cache.put(TuneResult(p, [
            TuneRecord("direct", "ok", median_s=ratio * cost_model.raw_predict("direct", p)),
            TuneRecord("im2col_gemm", "ok", median_s=cost_model.raw_predict("im2col_gemm", p))]))
    assert cost_model.correction_factors()[("conv2d_fwd", "direct")] == pytest.approx(0.625)  # the median

    def factor(algo, d):
        p = ConvProblem.parse(d)
        return cost_model.predict(algo, p) / cost_model.raw_predict(algo.name, p)

    scale = 1.0  # the median over all twelve records
    assert factor(direct, "mb8ic128ih56oc128oh56kh1ph0") < 0.45
    assert 0.8 < factor(direct, "mb8ic128ih56oc128oh56kh3ph1") <= scale
    assert factor(im2col, "mb8ic128ih56oc128oh56kh1ph0") == pytest.approx(scale)
    far = factor(direct, "mb1ic3ih224oc64oh112kh7sh2ph3")
    assert 0.8 < far <= scale


def test_measured_ceilings_replace_the_nominal_ones(fresh_cache, monkeypatch):
    p = ConvProblem.parse("mb8ic64ih56oc64oh56kh3ph1")
    algo = algos.get("conv2d_fwd", "cpu", "direct")
    nominal = cost_model.predict(algo, p)
    fresh_cache.put_ceilings(cost_model.nominal_peak_flops() / 2, 10e9)
    assert cost_model.predict(algo, p) == pytest.approx(2 * nominal)
    # (The FMA loop faked: a test machine's other work must not decide whether the figure is stored.)
    _fake_peak(monkeypatch, 1.2 * cost_model.nominal_peak_flops() / dnnkit.get_num_threads() / 1e9)
    got = cost_model.measure_ceilings(fresh_cache, seconds=0.02)
    assert got["stored"] and got["peak_flops"] > 1e9 and got["copy_bytes_per_s"] > 1e8
    assert fresh_cache.get_ceilings() == pytest.approx({k: got[k] for k in ("peak_flops", "copy_bytes_per_s")})


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["gemm", "conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_filter"])
def test_the_oracle_is_not_a_dnnkit_kernel(kind, dtype, monkeypatch):
    """The accuracy check compares every candidate with reference.py's float64 NumPy result, not with a
    dnnkit kernel run in float64: with every algorithm's output off by 0.1%, each one is found out."""
    if kind == "gemm":
        p = GemmProblem(40, 33, 70, dtype=dtype)
    else:
        p = ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1", direction=kind.split("_", 1)[1], dtype=dtype)
    for a in algos.algorithms(p.op, "cpu"):
        def off(*args, _run=a.run, **kwargs):
            out = _run(*args, **kwargs)
            kwargs["out"] *= 1.001
            return out
        monkeypatch.setattr(a, "run", off)
    result = find(p, budget=0.01, prune=None, store=False)
    ran = [r for r in result if r.status in ("ok", "inaccurate")]
    assert ran and all(r.status == "inaccurate" and r.error > r.tolerance for r in ran), str(result)


def test_a_stored_peak_under_the_nominal_floor_is_not_used(fresh_cache):
    nominal = cost_model.nominal_peak_flops()
    fresh_cache.put_ceilings(0.05 * nominal, 5e9)  # six tuners starting at once stored such a figure
    used = cost_model.ceilings()
    assert used["peak_flops"] == nominal and "under load" in used["source"]
    fresh_cache.put_ceilings(1.3 * nominal, 5e9)
    used = cost_model.ceilings()
    assert used["peak_flops"] == 1.3 * nominal and used["source"] == "measured"


def _fake_peak(monkeypatch, per_thread_gflops, *, all_threads=None):
    def fake(nthreads, seconds, isa=None):
        return 1e9 * (all_threads if all_threads is not None and nthreads > 1 else per_thread_gflops * nthreads)
    monkeypatch.setattr(cost_model._cpu, "measure_peak_flops", fake)


def test_a_peak_measured_under_load_is_not_stored(fresh_cache, monkeypatch):
    nominal_one = cost_model.nominal_peak_flops() / dnnkit.get_num_threads() / 1e9
    _fake_peak(monkeypatch, 0.05 * nominal_one)
    with pytest.warns(RuntimeWarning, match="not stored"):
        assert cost_model.measure_ceilings(fresh_cache, attempts=2)["stored"] is False
    assert fresh_cache.get_ceilings() is None
    if dnnkit.get_num_threads() > 1:  # all threads far under one thread's times their count: busy cores
        _fake_peak(monkeypatch, nominal_one, all_threads=0.5 * nominal_one * dnnkit.get_num_threads())
        with pytest.warns(RuntimeWarning, match="not stored"):
            cost_model.measure_ceilings(fresh_cache, attempts=2)
        assert fresh_cache.get_ceilings() is None


def test_autotune_measures_again_over_an_implausible_peak(fresh_cache, monkeypatch, capsys):
    from dnnkit.cli import main

    nominal = cost_model.nominal_peak_flops()
    fresh_cache.put_ceilings(0.05 * nominal, 5e9)
    _fake_peak(monkeypatch, 1.1 * nominal / dnnkit.get_num_threads() / 1e9)
    assert main(["autotune", "--problem", "m8n8k8", "--budget", "0.01"]) == 0
    assert fresh_cache.get_ceilings()["peak_flops"] == pytest.approx(1.1 * nominal)
    assert cost_model.ceilings()["source"] == "measured"


class _Logged(_Planted):
    """im2col_gemm that logs each call (its name and its input array) into a shared list; with fail_after,
    it raises from that call on."""

    def __init__(self, name, log, fail_after=None):
        super().__init__(name)
        self.log, self.fail_after = log, fail_after

    def run(self, p, a0, a1, *, out, bias=None, workspace=None):
        self.log.append((self.name, id(a0)))
        if self.fail_after is not None and self.runs >= self.fail_after:
            self.runs += 1
            raise RuntimeError("fault after warm-up")
        return super().run(p, a0, a1, out=out, bias=bias, workspace=workspace)


def test_candidates_are_timed_in_alternating_rounds_on_rotated_inputs(planted, fresh_cache):
    log = []
    for name in ("logged_a", "logged_b"):
        planted(_Logged(name, log))
    p = ConvProblem.parse(SMALL_CONV)
    result = find(p, budget=0.05, prune=None, store=False)
    calls = [name for name, _ in log if name.startswith("logged")]
    switches = sum(1 for x, y in zip(calls, calls[1:]) if x != y)
    assert switches >= 2 * tuner.ROUNDS - 1, calls  # warm-ups, then each round a run of each
    by_name = {r.algorithm: r for r in result}
    # A small problem's operands fit the last-level cache: its calls cycle through copies of them.
    assert "rotated over" in by_name["logged_a"].inputs
    assert len({a0 for name, a0 in log if name == "logged_a"}) > 1


def test_a_candidate_failing_while_timed_is_failed_and_the_others_ranked(planted, fresh_cache):
    log = []
    planted(_Logged("fails_later", log, fail_after=2))
    planted(_Logged("steady", log))
    result = find(ConvProblem.parse(SMALL_CONV), budget=0.05, prune=None, store=False)
    by_name = {r.algorithm: r for r in result}
    assert by_name["fails_later"].status == "failed" and "fault after warm-up" in by_name["fails_later"].reason
    assert by_name["steady"].ok and by_name["steady"].reps >= tuner.MIN_REPS


RESNET_3X3 = ["mb8ic64ih56oc64oh56kh3ph1", "mb8ic128ih28oc128oh28kh3ph1", "mb8ic256ih14oc256oh14kh3ph1",
              "mb8ic512ih7oc512oh7kh3ph1"]
RESNET_1X1 = ["mb8ic256ih56oc64oh56kh1ph0", "mb8ic64ih56oc256oh56kh1ph0", "mb8ic2048ih7oc512oh7kh1ph0"]


@pytest.mark.parametrize("ceilings", ["nominal", "measured-low", "measured-high"])
def test_the_cost_model_picks_what_wins_on_resnet50(fresh_cache, ceilings):
    """The heuristic's picks on ResNet-50 at batch 8 (bench/conv.py: Winograd F(4x4) the fastest on every 3x3
    layer, an im2col-family GEMM on the 1x1 layers) hold whatever ceilings the model scales by, since all
    its terms scale with them: a model that makes one algorithm several times too slow or too fast fails."""
    nominal = cost_model.nominal_peak_flops()
    if ceilings != "nominal":
        fresh_cache.put_ceilings(nominal * (0.5 if ceilings == "measured-low" else 1.3), 8e9)
        assert cost_model.ceilings()["source"] == "measured"
    for d in RESNET_3X3:
        assert choose(ConvProblem.parse(d)).name == "winograd_f4x4_3x3", (d, ceilings)
    for d in RESNET_1X1:
        assert choose(ConvProblem.parse(d)).name in ("im2col_gemm", "implicit_gemm"), (d, ceilings)


def test_one_image_on_two_threads_is_one_product_split_between_them(fresh_cache):
    """implicit_gemm gives each thread whole (image, group) products only while there are as many of them as
    threads; one image's product is split between the threads as im2col_gemm's GEMM is, with the filters'
    packing on top: on a 1x1 layer of one image the plain GEMM is predicted faster, as bench/conv.py --batch 1
    measures it. At batch 1 Winograd F(4x4) still wins ResNet-50's 3x3 layers of 14x14 pixels and more."""
    threads = dnnkit.get_num_threads()
    dnnkit.set_num_threads(2)
    try:
        for d in ["mb1ic1024ih14oc256oh14kh1ph0", "mb1ic256ih14oc1024oh14kh1ph0"]:
            p = ConvProblem.parse(d)
            assert choose(p).name == "im2col_gemm", d
            assert cost_model.raw_predict("implicit_gemm", p) > cost_model.raw_predict("im2col_gemm", p)
        for d in RESNET_3X3[:3]:
            assert choose(ConvProblem.parse(d.replace("mb8", "mb1"))).name == "winograd_f4x4_3x3", d
    finally:
        dnnkit.set_num_threads(threads)


def test_a_wrong_model_is_caught(fresh_cache, monkeypatch):
    """The test above guards the model: Winograd's transforms made 50x too slow change its picks."""
    from dnnkit.algos import conv_cpu

    monkeypatch.setattr(conv_cpu, "TRANSFORM_FLOPS", conv_cpu.TRANSFORM_FLOPS * 50)
    picks = [choose(ConvProblem.parse(d)).name for d in RESNET_3X3]
    assert picks.count("winograd_f4x4_3x3") < len(RESNET_3X3)


def test_the_fit_reads_only_new_rows_of_this_device(fresh_cache, monkeypatch):
    """After a write, the refit parses the rows written since (not the whole store), skips other devices'
    rows, and starts over when rows were removed."""
    algo = algos.get("conv2d_fwd", "cpu", "im2col_gemm")
    layers = ["mb8ic64ih56oc64oh56kh3ph1", "mb8ic128ih28oc128oh28kh3ph1", "mb8ic256ih14oc256oh14kh3ph1"]
    for d in layers[:2]:
        p = ConvProblem.parse(d)
        fresh_cache.put(TuneResult(p, [TuneRecord(algo.name, "ok", median_s=2 * cost_model.raw_predict(algo.name, p))]))
    other = ConvProblem.parse("mb4ic64ih56oc64oh56kh3ph1")
    fresh_cache.put(TuneResult(other, [TuneRecord(algo.name, "ok", median_s=100.0)]), device="cpu|another|avx2|2t")
    assert cost_model.correction_factors()[("conv2d_fwd", "im2col_gemm")] == pytest.approx(2.0)
    parsed = []
    real = cost_model._samples
    monkeypatch.setattr(cost_model, "_samples", lambda c, problem, rec: parsed.append(problem) or real(c, problem, rec))
    p = ConvProblem.parse(layers[2])
    fresh_cache.put(TuneResult(p, [TuneRecord(algo.name, "ok", median_s=2 * cost_model.raw_predict(algo.name, p))]))
    assert cost_model.correction_factors()[("conv2d_fwd", "im2col_gemm")] == pytest.approx(2.0)
    assert parsed == [cache.problem_key(p)]
    for d in (layers[2], layers[0]):
        fresh_cache.clear(cache.problem_key(ConvProblem.parse(d)), device=cache.device_fingerprint())
    assert ("conv2d_fwd", "im2col_gemm") not in cost_model.correction_factors()  # one row left: too few
