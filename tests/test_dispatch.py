"""Dispatch: explicit algo > tuning mode; 'off' is registry order, 'heuristic' the cost model's fastest."""
import numpy as np
import pytest

import dnnkit
from dnnkit import algos
from dnnkit.autotune import predict
from dnnkit.dispatch import choose
from dnnkit.problem import ConvProblem, GemmProblem

LAYERS = [
    "mb8ic64ih56oc64oh56kh3ph1",    # 3x3, 64 channels
    "mb8ic512ih7oc512oh7kh3ph1",    # 3x3, small plane
    "mb8ic16ih64oc16oh64kh11ph5",   # large filter
    "mb8ic256ih56oc64oh56kh1ph0",   # 1x1
    "mb2ic6ih9oc4oh5kh3sh2ph1",     # strided
]


@pytest.fixture
def restore_tuning():
    mode, limit = dnnkit.get_tuning(), dnnkit.get_workspace_limit()
    yield
    dnnkit.set_tuning(mode)
    dnnkit.set_workspace_limit(limit)


@pytest.mark.parametrize("desc", LAYERS)
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_off_takes_the_first_supporting_algorithm(desc, direction, restore_tuning):
    dnnkit.set_tuning("off")
    p = ConvProblem.parse(desc, direction=direction)
    first = next(a for a in algos.algorithms(p.op, "cpu") if a.supports(p) is None)
    assert choose(p) is first


@pytest.mark.parametrize("desc", LAYERS)
@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_heuristic_takes_the_fastest_predicted_supporting_algorithm(desc, direction, restore_tuning):
    dnnkit.set_tuning("heuristic")
    p = ConvProblem.parse(desc, direction=direction)
    supported = [a for a in algos.algorithms(p.op, "cpu") if a.supports(p) is None]
    times = {a.name: predict(a, p) for a in supported}
    assert all(t is not None and t > 0 for t in times.values())
    chosen = choose(p)
    assert chosen in supported
    assert times[chosen.name] == min(times.values())


def test_heuristic_respects_the_workspace_limit(restore_tuning):
    """Chunked algorithms shrink their workspace to a limit; whatever is chosen must fit it."""
    dnnkit.set_tuning("heuristic")
    p = ConvProblem.parse(LAYERS[0])
    for limit in (10**9, 4 << 20, 300_000, 0):
        dnnkit.set_workspace_limit(limit)
        chosen = choose(p)
        assert chosen.workspace_bytes(p) <= limit
    assert choose(p).name == "direct"  # with no workspace, only direct remains for a padded 3x3


def test_explain_shows_predictions_for_supported_candidates():
    lines = dnnkit.explain(LAYERS[2])
    for c in lines:
        assert (c.predicted_s is not None) == c.supported
    assert sum(c.chosen for c in lines) == 1
    assert "predicted" in str(lines)


def test_gemm_follows_its_rules_in_heuristic_mode(restore_tuning):
    dnnkit.set_tuning("heuristic")
    small = GemmProblem(4, 256, 256, trans_b=True)
    big = GemmProblem(512, 256, 256, trans_b=True)
    assert choose(small).name == "gemm_small_m"
    assert choose(big).name == "blocked_gemm"


def test_heuristic_result_is_correct_end_to_end(restore_tuning):
    dnnkit.set_tuning("heuristic")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    ref = dnnkit.conv2d(x.astype(np.float64), w.astype(np.float64), padding=1, algo="direct")
    y = dnnkit.conv2d(x, w, padding=1)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-4


def test_a_choice_follows_the_thread_count_it_was_tuned_for(tmp_path, monkeypatch):
    """The dispatch memo is keyed by what a cached record is keyed by: after set_num_threads, the record
    of the new thread count decides, not the decision remembered for the old one."""
    from dnnkit.autotune import cache
    from dnnkit.autotune.records import TuneRecord, TuneResult

    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    p = ConvProblem.parse("mb1ic8ih12oc8oh12kh3ph1")
    store = cache.default_store()
    before = dnnkit.get_num_threads()
    try:
        for threads, best in ((1, "direct"), (2, "im2col_gemm")):
            dnnkit.set_num_threads(threads)
            store.put(TuneResult(p, [TuneRecord(best, "ok", median_s=1e-4, workspace_bytes=0)], 0.1))
        for threads, best in ((1, "direct"), (2, "im2col_gemm"), (1, "direct")):
            dnnkit.set_num_threads(threads)
            assert choose(p).name == best
    finally:
        dnnkit.set_num_threads(before)
        store.close()


def test_a_record_tuned_under_a_tighter_workspace_limit_does_not_decide_without_it(tmp_path, monkeypatch):
    """autotune --workspace-limit 0 leaves the algorithms that need workspace untimed (over_limit): its
    record decides for callers under that limit, not for one without it."""
    from dnnkit import dispatch
    from dnnkit.autotune import cache
    from dnnkit.autotune.records import TuneRecord, TuneResult

    monkeypatch.setenv("DNNKIT_CACHE_DIR", str(tmp_path))
    p = ConvProblem.parse("mb1ic32ih28oc32oh28kh3ph1")
    store = cache.default_store()
    store.put(TuneResult(p, [TuneRecord("direct", "ok", median_s=4.9e-4, workspace_bytes=0),
                             TuneRecord("winograd_f4x4_3x3", "over_limit", workspace_bytes=1 << 20)], 0.1))
    supported = [a for a, reason, _ in dispatch.candidates(p, None) if reason is None]
    assert dispatch._tuned(p, supported, 0).name == "direct"
    assert dispatch._tuned(p, supported, 1 << 10).name == "direct"
    assert dispatch._tuned(p, supported, None) is None and dispatch._tuned(p, supported, 1 << 20) is None
    store.close()


def test_dispatch_returns_a_plan_kept_per_problem_and_state(restore_tuning):
    """A plan is the algorithm, its workspace on the problem and its run() bound to the problem; the same
    call again gets the same plan, a change of what the decision depends on (the workspace limit, the
    thread count) a new one."""
    from dnnkit.dispatch import plan
    from dnnkit.plans import Memo

    p = ConvProblem.parse("mb1ic4ih10oc8oh10kh3ph1")
    first = plan(p)
    assert first is plan(p) and first.problem is p and first.algorithm is choose(p)
    assert first.workspace_bytes == first.algorithm.workspace_bytes(p)
    x = np.random.default_rng(0).standard_normal(p.input_shape).astype(np.float32)
    w = np.random.default_rng(1).standard_normal(p.weight_shape).astype(np.float32)
    y = np.empty(p.output_shape, np.float32)
    ws = None if first.workspace_bytes == 0 else np.empty(first.workspace_bytes // 4, np.float32)
    first.run(x, w, out=y, workspace=ws)
    np.testing.assert_array_equal(y, dnnkit.conv2d(x, w, padding=1, algo=first.algorithm.name))
    dnnkit.set_workspace_limit(0)
    assert plan(p) is not first and plan(p).workspace_bytes == 0
    dnnkit.set_workspace_limit(None)
    threads = dnnkit.get_num_threads()
    dnnkit.set_num_threads(threads + 1)
    try:
        assert plan(p) is not first
    finally:
        dnnkit.set_num_threads(threads)
    memo = Memo(2)
    for i in range(5):
        memo.put(i, i)
        assert len(memo) <= 2 and memo[i] == i


def test_every_change_a_decision_depends_on_changes_the_dispatch_state(store, restore_tuning):
    """The remembered decisions (plans, and each operator's repeated calls) are keyed by dispatch_state():
    each setting, the registry and the tuning cache's writes move it, and a repeated call then decides
    again."""
    from dnnkit.algos.base import Algorithm
    from dnnkit.dispatch import dispatch_state
    from helpers import cached_result

    class Extra(Algorithm):
        op, backend, name = "gemm", "cpu", "extra_for_the_state_test"

    changes = [
        lambda: dnnkit.set_tuning("off"), lambda: dnnkit.set_tuning("heuristic"),
        lambda: dnnkit.set_workspace_limit(1 << 20), lambda: dnnkit.set_workspace_limit(None),
        lambda: dnnkit.set_nan_semantics("strict"), lambda: dnnkit.set_nan_semantics("any"),
        lambda: dnnkit.set_allow_tf32(True), lambda: dnnkit.set_allow_tf32(False),
        lambda: algos.register(extra), lambda: algos.unregister(extra),
        lambda: store.put(cached_result()), lambda: store.clear(),
        lambda: dnnkit.set_num_threads(threads + 1), lambda: dnnkit.set_num_threads(threads),
    ]
    extra, threads = Extra(), dnnkit.get_num_threads()
    seen = [dispatch_state()]
    for change in changes:
        change()
        assert dispatch_state() not in seen
        seen.append(dispatch_state())
    # A repeated call sees the change: the limit keeps out the workspace its first decision took.
    x = np.ones((1, 16, 20, 20), np.float32)
    w = np.ones((16, 16, 3, 3), np.float32)
    first = dnnkit.conv2d(x, w, padding=1, algo="im2col_gemm")
    dnnkit.set_workspace_limit(0)
    with pytest.raises(ValueError, match="workspace"):
        dnnkit.conv2d(x, w, padding=1, algo="im2col_gemm")
    dnnkit.set_workspace_limit(None)
    np.testing.assert_array_equal(dnnkit.conv2d(x, w, padding=1, algo="im2col_gemm"), first)


@pytest.mark.parametrize("mode", ["heuristic", "off"])
def test_rules_decide_where_nothing_is_measured(mode, restore_tuning):
    """A rule is not a capability: gemm_small_m can run 400 rows (algo= may name it, the tuner times it),
    but untuned dispatch takes the algorithm whose rule holds; explain() gives the rule's reason."""
    dnnkit.set_tuning(mode)
    big, small = GemmProblem(400, 256, 512, trans_b=True), GemmProblem(4, 256, 512, trans_b=True)
    small_m = algos.get("gemm", "cpu", "gemm_small_m")
    assert small_m.supports(big) is None and "faster" in small_m.rule(big)
    assert choose(big).name == "blocked_gemm" and choose(small).name == "gemm_small_m"
    assert choose(big, "gemm_small_m") is small_m
    row = next(c for c in dnnkit.explain(big) if c.algorithm == "gemm_small_m")
    assert row.supported and "m = 400 is over 16" in row.rule and "rule:" in str(row)


def test_environment_names_an_operators_algorithm(tmp_path):
    """DNNKIT_ALGO_<OP> is what algo="auto" means for that operator; a name it does not have is an error
    that names the variable."""
    import subprocess
    import sys

    code = ("import numpy as np, dnnkit\n"
            "from dnnkit.dispatch import choose\n"
            "from dnnkit.problem import ConvProblem, GemmProblem\n"
            "print(choose(ConvProblem.parse('mb2ic8ih10oc8oh10kh3ph1')).name, choose(GemmProblem(64, 64, 64)).name)\n"
            "try:\n"
            "    dnnkit.lstm(np.ones((3, 2, 4), np.float32), None, None, [np.ones((8, 4), np.float32),"
            " np.ones((8, 2), np.float32)])\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    env = dict(__import__("os").environ, DNNKIT_ALGO_CONV2D_FWD="direct", DNNKIT_ALGO_GEMM="gemm_goto",
               DNNKIT_ALGO_LSTM_FWD="no_such", DNNKIT_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "direct gemm_goto", r.stdout + r.stderr
    assert "lstm: algo must be 'auto' or one of" in lines[1] and "DNNKIT_ALGO_LSTM_FWD" in lines[1], lines


def test_an_unhashable_algo_is_a_clear_error():
    x, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match=r"^linear: algo must be 'auto', an algorithm name or an Algorithm, got list"):
        dnnkit.linear(x, w, algo=["blocked_gemm"])
    h, wh = np.ones((2, 4), np.float32), np.ones((16, 4), np.float32)
    with pytest.raises(TypeError, match=r"^lstm_cell: algo must be .* got dict"):
        dnnkit.lstm_cell(x, (h, h), np.ones((16, 3), np.float32), wh, algo={})
