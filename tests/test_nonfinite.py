"""NaN and Inf: each algorithm's declared behaviour (Algorithm.nonfinite) is what it does, strict NaN
semantics keeps dispatch to the algorithms that propagate them exactly, and strict tuning checks it."""
from __future__ import annotations

import numpy as np
import pytest

import dnnkit
from dnnkit import algos
from dnnkit.algos.conv_cpu import DirectFwd
from dnnkit.autotune import harness
from dnnkit.autotune.tuner import find
from dnnkit.dispatch import choose
from dnnkit.problem import ConvProblem, GemmProblem, RnnProblem

CONV = ["mb1ic4ih12oc4oh12kh3ph1", "mb2ic4ih12oc4oh12kh3ph1g4", "mb1ic3ih13oc5oh13kh3ph1", "mb1ic4ih12oc4oh6kh3sh2ph1",
        "mb1ic4ih12oc8oh12kh5ph2", "mb2ic6ih10oc6oh10kh3ph1g6"]
OTHERS = [GemmProblem(9, 20, 13), GemmProblem(40, 24, 300, trans_b=True), GemmProblem(3, 64, 600),
          RnnProblem.parse("lstm_l2t4mb8slc3sic5"), RnnProblem.parse("gru_l1t3mb4slc3sic5_bidir", direction="bwd"),
          RnnProblem.parse("rnn_relu_l1t3mb8slc4sic6", direction="bwd")]


def _planted_runs(p):
    """(algorithm, whether its NaN/+Inf/-Inf match the reference's) on p with a NaN and an Inf, and with a
    -Inf, planted in the data input."""
    h = harness.harness(p)
    out = []
    for special in (None, -np.inf):
        ops = h.with_nonfinite(p, h.operands(p, np.random.default_rng(0)))
        if special is not None:
            a = ops.args[h.data_arg(p)].reshape(-1)
            a[np.isposinf(a)] = special
        with np.errstate(all="ignore"):
            expected = h.reference(p, ops)
        for a in algos.algorithms(p.op, "cpu"):
            if a.supports(p) is None:
                got = h.output(p, ops, fill=0.0)
                with np.errstate(all="ignore"):
                    h.run(a, p, ops, got, a.workspace_bytes(p))
                out.append((a, harness.same_nonfinite(h.result(p, got), expected)))
    return out


def test_every_algorithm_does_what_its_nonfinite_says():
    """exact: NaN, +Inf and -Inf where the reference has them on every planted input; tiles or all: not
    so on at least one (else the declaration undersells the algorithm)."""
    seen = {}
    problems = [ConvProblem.parse(d, direction=dr) for d in CONV for dr in ("fwd", "bwd_data", "bwd_filter")]
    for p in problems + OTHERS:
        for a, same in _planted_runs(p):
            key = (a.op, a.name)
            seen.setdefault(key, (a, []))[1].append(same)
    for (op, name), (a, results) in seen.items():
        if a.nonfinite == "exact":
            assert all(results), f"{op}/{name} is declared exact but differs from the reference"
        else:
            assert not all(results), f"{op}/{name} is declared {a.nonfinite!r} but propagated exactly"
    assert {("conv2d_fwd", "fft"), ("conv2d_fwd", "winograd_f4x4_3x3"), ("lstm_fwd", "fused_rows")} <= set(seen)


@pytest.fixture
def strict():
    before = dnnkit.get_nan_semantics()
    dnnkit.set_nan_semantics("strict")
    yield
    dnnkit.set_nan_semantics(before)


def test_strict_dispatch_takes_only_exact_algorithms(strict):
    p = ConvProblem.parse("mb8ic64ih28oc64oh28kh3ph1")
    assert choose(p).nonfinite == "exact"
    rows = {c.algorithm: c for c in dnnkit.explain(p)}
    assert not rows["winograd_f4x4_3x3"].supported and "nan_semantics is strict" in rows["winograd_f4x4_3x3"].reason
    with pytest.raises(ValueError, match="nan_semantics is strict"):
        dnnkit.conv2d(np.zeros((1, 2, 6, 6), np.float32), np.zeros((2, 2, 3, 3), np.float32), algo="fft")
    x = np.random.default_rng(0).standard_normal((1, 4, 12, 12)).astype(np.float32)
    x[0, 1, 5, 5] = np.nan
    w = np.random.default_rng(1).standard_normal((4, 4, 3, 3)).astype(np.float32)
    y = dnnkit.conv2d(x, w, padding=1)
    assert np.isnan(y).sum() == 4 * 9  # the 3x3 window of every output channel, as torch gives


def test_explain_reports_each_algorithms_nonfinite_behaviour():
    rows = {c.algorithm: c for c in dnnkit.explain(ConvProblem.parse("mb1ic8ih14oc8oh14kh3ph1"))}
    assert rows["fft"].nonfinite == "all" and rows["winograd_f2x2_3x3"].nonfinite == "tiles"
    assert rows["im2col_gemm"].nonfinite == "exact"
    assert "NaN/Inf: tiles" in str(rows["winograd_f4x4_3x3"])


def test_strict_tuning_checks_planted_nan_and_inf():
    """Strict tuning leaves out what is declared inexact and runs the rest on planted NaN and Inf: an
    algorithm declared exact whose outputs lose them is excluded as inaccurate."""

    class Swallows(DirectFwd):
        name = "planted_swallows_nan"

        def run(self, p, *args, out, **kw):
            super().run(p, *args, out=out, **kw)
            np.nan_to_num(out, copy=False)

    bad = algos.register(Swallows())
    try:
        p = ConvProblem.parse("mb1ic4ih12oc4oh12kh3ph1")
        by_name = {r.algorithm: r for r in find(p, store=False, budget=0.02, prune=None, nan_semantics="strict")}
        assert by_name[bad.name].status == "inaccurate" and "NaN and Inf" in by_name[bad.name].reason
        assert by_name["fft"].status == "unsupported" and "strict" in by_name["fft"].reason
        assert by_name["direct"].ok and by_name["im2col_gemm"].ok
        loose = {r.algorithm: r for r in find(p, store=False, budget=0.02, prune=None, nan_semantics="any")}
        assert loose[bad.name].ok and loose["fft"].ok
    finally:
        algos.unregister(bad)
    with pytest.raises(ValueError, match="nan_semantics"):
        find(p, store=False, nan_semantics="loose")


def test_nan_semantics_setting_and_environment(tmp_path):
    import subprocess
    import sys

    with pytest.raises(ValueError, match="set_nan_semantics"):
        dnnkit.set_nan_semantics("maybe")
    code = "import dnnkit; print(dnnkit.get_nan_semantics(), dnnkit.info(gpu=False)['nan_semantics'])"
    for value, want in (("strict", "strict strict"), ("bogus", "any any")):
        env = dict(__import__("os").environ, DNNKIT_NAN_SEMANTICS=value)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert r.stdout.strip() == want, r.stderr
        assert ("DNNKIT_NAN_SEMANTICS" in r.stderr) == (value == "bogus")
