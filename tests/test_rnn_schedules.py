"""The RNN time-loop schedules (rows, wavefront) against the split by hidden units, dropout between
layers, and recompute, against the float64 references."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnkit
from dnnkit.algos.rnn_cpu import SCHEDULES
from dnnkit.reference import rel_l2, rnn_sequence_backward_ref, rnn_sequence_ref
from helpers import DTYPES, central_differences
from rnn_cases import (
    BWD_TOL32, FWD_TOL32, MODES, SeqCase, from_user, make_seq, param_names, run_backward, run_forward,
    seq_cases, to_user, tol,
)

pytestmark = pytest.mark.usefixtures("nan_rnn_outputs")


# ------------------------------------------------------------------------------------------ wavefront
WAVE_CASES = [
    # (mode, T, B, I, H, layers, initial): chunk boundaries (16 chunks), layers > threads, h0 or not
    ("lstm", 2, 1, 3, 5, 2, True),
    ("lstm", 17, 5, 7, 33, 3, False),
    ("gru", 33, 2, 4, 40, 2, True),
    ("rnn_tanh", 20, 3, 6, 9, 4, True),
    ("rnn_relu", 5, 1, 2, 3, 2, False),
    ("lstm", 4, 16, 400, 48, 2, True),  # 64 rows of depth 400: the first layer's projections by gemm_wt_direct
]


def assert_same_schedules(c, schedule, rule):
    """Runs c's forward (training and inference) and backward with algo "fused_units" and then `schedule`
    (backward: "fused_rows" where that is the schedule, else "fused_units") on c.threads threads, checks that
    `rule` (a _cpu predicate of the kernel's shape and itemsize) says no for the first and yes for the
    second, and that both runs give exactly the same outputs, final states and gradients, and outputs near
    the reference."""
    x, h0, c0, weights = make_seq(c)
    shape = (["lstm", "gru", "rnn_tanh", "rnn_relu"].index(c.mode), c.T, c.B, c.I, c.H, c.layers, c.D, 0)
    previous = dnnkit.get_num_threads()
    dnnkit.set_num_threads(c.threads)
    runs = {}
    try:
        for algo in ("fused_units", schedule):
            code = SCHEDULES[algo]
            assert rule(shape + (code,), np.dtype(c.dtype).itemsize) == (algo == schedule)
            out, state, reserve = run_forward(c, x, h0, c0, weights, train=True, algo=algo)
            inference, _ = run_forward(c, x, h0, c0, weights, algo=algo)
            rng = np.random.default_rng(1)
            gy = rng.standard_normal(out.shape).astype(c.dtype)
            bwd = algo if algo != "fused_wavefront" else "fused_units"
            if c.mode == "lstm":
                gh, gc = (rng.standard_normal(a.shape).astype(c.dtype) for a in state)
                grads = dnnkit.lstm_backward(gy, gh, gc, reserve, algo=bwd)
                state = state[0], state[1]
            else:
                gh = rng.standard_normal(state.shape).astype(c.dtype)
                backward = dnnkit.gru_backward if c.mode == "gru" else dnnkit.rnn_backward
                grads = backward(gy, gh, reserve, algo=bwd)
                state = (state,)
            runs[algo] = (out, inference, state, grads)
    finally:
        dnnkit.set_num_threads(previous)
    (o0, i0, s0, g0), (o1, i1, s1, g1) = runs["fused_units"], runs[schedule]
    assert np.array_equal(o0, o1) and np.array_equal(i0, i1) and np.array_equal(o1, i1)
    for a, b in zip(s0, s1):
        assert np.array_equal(a, b)
    flat = lambda g: [a for v in g for a in (v if isinstance(v, (list, tuple)) else [v]) if a is not None]
    assert len(flat(g0)) == len(flat(g1)) > 0
    for a, b in zip(flat(g0), flat(g1)):
        assert np.array_equal(a, b)
    eo, _, _ = rnn_sequence_ref(c.mode, x, h0, c0, weights, c.layers, c.bidirectional)
    assert rel_l2(o1, eo) <= tol(c.dtype, FWD_TOL32)


@pytest.mark.parametrize("case", WAVE_CASES, ids=lambda c: f"{c[0]}-T{c[1]}-L{c[5]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_wavefront_pipeline_matches_layer_by_layer(case, dtype):
    """The pipelined multi-layer forward (one thread per layer, chunks of steps) gives exactly the
    layer-by-layer driver's outputs, states and saved activations, so backward agrees too."""
    mode, T, B, I, H, layers, initial = case
    c = SeqCase(mode=mode, T=T, B=B, I=I, H=H, layers=layers, bidirectional=False, bias=True, initial=initial,
                batch_first=False, unbatched=False, as_dict=False, dtype=dtype, threads=2, seed=T * 31 + H)
    assert_same_schedules(c, "fused_wavefront", dnnkit._cpu.rnn_uses_wavefront)


ROW_SPLIT_CASES = [
    # (mode, T, B, I, H, layers, bidirectional, threads, initial): rows shared evenly and not, layers that
    # would otherwise run as a wavefront, three threads, two threads a direction, H off the panel width
    ("lstm", 5, 16, 7, 40, 1, False, 2, True),
    ("lstm", 3, 17, 5, 33, 2, False, 2, False),
    ("gru", 4, 37, 6, 70, 1, False, 3, True),
    ("rnn_tanh", 6, 24, 3, 20, 3, False, 2, True),
    ("rnn_relu", 2, 16, 4, 9, 1, False, 2, False),
    ("lstm", 3, 9, 4, 30, 1, False, 2, True),  # 4 and 5 rows
    ("lstm", 4, 32, 8, 48, 2, True, 4, True),
    ("gru", 3, 16, 5, 64, 1, True, 4, False),
]


@pytest.mark.parametrize("case", ROW_SPLIT_CASES, ids=lambda c: f"{c[0]}-B{c[2]}-L{c[5]}-nt{c[7]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_time_loop_split_by_rows_matches_split_by_units(case, dtype):
    """Threads that each run their own batch rows through every step (no barrier) give exactly what threads
    sharing each step's hidden units give: outputs, final states, and every gradient of backward."""
    mode, T, B, I, H, layers, bidirectional, threads, initial = case
    c = SeqCase(mode=mode, T=T, B=B, I=I, H=H, layers=layers, bidirectional=bidirectional, bias=True,
                initial=initial, batch_first=False, unbatched=False, as_dict=False, dtype=dtype, threads=threads,
                seed=B * 7 + H)
    assert_same_schedules(c, "fused_rows", dnnkit._cpu.rnn_splits_rows)


def test_time_loop_split_by_rows_rule():
    """Rows are split where W_hh fits a core's L2 and every thread of a direction gets 4 rows or more; a
    stack of small layers runs as a wavefront below 8 rows a thread."""
    previous = dnnkit.get_num_threads()
    l2 = dnnkit._cpu.l2_cache_bytes()
    try:
        dnnkit.set_num_threads(2)
        H = int(np.sqrt(l2 / 16)) // 2  # an LSTM whose float32 W_hh is a quarter of L2
        assert dnnkit._cpu.rnn_splits_rows((0, 50, 8, H, H, 1, 1), 4)
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 7, H, H, 1, 1), 4)  # 3 rows for one thread
        small = (0, 50, 8, 32, 32, 2, 1)  # two layers of W_hh 16 KiB
        assert dnnkit._cpu.rnn_splits_rows(small, 4) and dnnkit._cpu.rnn_uses_wavefront(small, 4)
        small = (0, 50, 16, 32, 32, 2, 1)
        assert dnnkit._cpu.rnn_splits_rows(small, 4) and not dnnkit._cpu.rnn_uses_wavefront(small, 4)
        assert not dnnkit._cpu.rnn_splits_rows((0, 1, 64, H, H, 1, 1), 4)  # one step: no time loop
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 64, 4 * H, 4 * H, 1, 1), 4)  # W_hh 4x L2
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 64, H, H, 1, 2), 4)  # a thread a direction already
        dnnkit.set_num_threads(1)
        assert not dnnkit._cpu.rnn_splits_rows((0, 50, 64, H, H, 1, 1), 4)
    finally:
        dnnkit.set_num_threads(previous)


# -------------------------------------------------------------------------------------------- dropout
def test_backward_reference_with_dropout_masks_matches_finite_differences():
    """The references with dropout masks between layers: the backward is the forward's derivative."""
    for mode in MODES:
        c = SeqCase(mode, 3, 2, 2, 2, 3, True, True, False, False, True, False, np.float64, 1, seed=11)
        x, h0, c0, weights = make_seq(c)
        rng = np.random.default_rng(2)
        masks = [(rng.random((3, 2, 4)) >= 0.4) / 0.6 for _ in range(2)]
        out, h_n, c_n = rnn_sequence_ref(mode, x, h0, c0, weights, 3, True, dropout_masks=masks)
        go, gh = rng.standard_normal(out.shape), rng.standard_normal(h_n.shape)
        gx, gh0, _, gw = rnn_sequence_backward_ref(mode, x, h0, c0, weights, go, gh, None, 3, True,
                                                  dropout_masks=masks)

        def loss():
            o, hn, _ = rnn_sequence_ref(mode, x, h0, c0, weights, 3, True, dropout_masks=masks)
            return np.sum(go * o) + np.sum(gh * hn)

        for a, g in [(x, gx), (h0, gh0), (weights[0], gw[0]), (weights[4], gw[4]), (weights[9], gw[9])]:
            assert rel_l2(g, central_differences(loss, a)) <= 1e-6


@given(c=seq_cases(), p=st.sampled_from([0.0, 0.25, 0.5, 1.0]), data=st.data())
@settings(max_examples=40)
def test_sequence_dropout_matches_reference(isa, c, p, data):
    """Training with dropout between layers: the output and every gradient match the float64 references
    run with the masks the forward drew (RnnReserve.dropout_masks), which keep about 1 - p of the
    elements and scale them by 1/(1-p); the same generator seed draws the same masks."""
    dnnkit.set_num_threads(c.threads)
    x, h0, c0, weights = make_seq(c)
    ux, uh0, uc0, uw = to_user(c, x, h0, c0, weights)
    seed = data.draw(st.integers(0, 2**32 - 1), label="generator seed")
    kw = dict(num_layers=c.layers, bidirectional=c.bidirectional, batch_first=c.batch_first, train=True, dropout=p,
              generator=seed)
    fwd = {"lstm": lambda: dnnkit.lstm(ux, uh0, uc0, uw, **kw), "gru": lambda: dnnkit.gru(ux, uh0, uw, **kw)}.get(
        c.mode, lambda: dnnkit.rnn(ux, uh0, uw, nonlinearity=c.mode[4:], **kw))
    out, state, reserve = fwd()
    masks = reserve.dropout_masks
    assert len(masks) == (c.layers - 1 if p > 0 else 0)
    for m in masks:
        assert m.shape == (c.T, c.B, c.D * c.H) and m.dtype == c.dtype
        assert set(np.unique(m)) <= ({0.0} if p == 1 else {0.0, np.float64(c.dtype(1 / (1 - p)))})
    again = fwd()[2].dropout_masks
    assert all(np.array_equal(a, b) for a, b in zip(masks, again))
    h_n = state[0] if c.mode == "lstm" else state
    eo, eh, _ = rnn_sequence_ref(c.mode, x, h0, c0, weights, c.layers, c.bidirectional, dropout_masks=masks or None)
    out_tm, h_tm = from_user(c, out, h_n)
    t = tol(c.dtype, FWD_TOL32)
    assert rel_l2(out_tm, eo) <= t and rel_l2(h_tm, eh) <= t

    rng = np.random.default_rng(c.seed + 3)
    go = rng.standard_normal((c.T, c.B, c.D * c.H)).astype(c.dtype)
    gh = rng.standard_normal((c.layers * c.D, c.B, c.H)).astype(c.dtype)
    u_go = go[:, 0] if c.unbatched else (go.transpose(1, 0, 2) if c.batch_first else go)
    dx, dh0, dc0, dw = run_backward(c, u_go, gh[:, 0] if c.unbatched else gh, None, reserve)
    ex, eh0, ec0, ew = rnn_sequence_backward_ref(c.mode, x, h0, c0, weights, go, gh, None, c.layers, c.bidirectional,
                                                 dropout_masks=masks or None)
    if c.unbatched:
        dx, dh0 = dx[:, None], dh0[:, None]
        dc0 = None if dc0 is None else dc0[:, None]
    elif c.batch_first:
        dx = dx.transpose(1, 0, 2)
    t = tol(c.dtype, BWD_TOL32)
    assert rel_l2(dx, ex) <= t and rel_l2(dh0, eh0) <= t
    if c.mode == "lstm":
        assert rel_l2(dc0, ec0) <= t
    if c.as_dict:
        dw = [dw[k] for k in param_names(c)]
    assert len(dw) == len(weights)
    for g, e in zip(dw, ew):
        assert rel_l2(g, e) <= t


def test_dropout_keeps_the_expected_fraction_and_is_off_in_inference():
    rng = np.random.default_rng(5)
    T, B, H = 20, 8, 32
    w = [0.2 * rng.standard_normal(s).astype(np.float32) for s in [(4 * H, H), (4 * H, H), (4 * H,), (4 * H,)] * 2]
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    _, _, r = dnnkit.lstm(x, None, None, w, num_layers=2, train=True, dropout=0.3, generator=np.random.default_rng(0))
    (mask,) = r.dropout_masks
    assert abs(np.mean(mask > 0) - 0.7) < 0.03
    assert r.reserve_bytes == (2 * 5 * T * B * H + T * B * H) * 4
    plain = dnnkit.lstm(x, None, None, w, num_layers=2)
    inference = dnnkit.lstm(x, None, None, w, num_layers=2, dropout=0.3)  # dropout only acts in training
    assert np.array_equal(plain[0], inference[0])
    trained = dnnkit.lstm(x, None, None, w, num_layers=2, train=True, dropout=0.0)
    assert np.array_equal(plain[0], trained[0]) and trained[2].dropout_masks == []


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(dropout=-0.1), ValueError, "lstm: dropout must be a probability in [0, 1]"),
    (dict(dropout=1.5), ValueError, "lstm: dropout must be a probability in [0, 1]"),
    (dict(dropout="0.2"), TypeError, "lstm: dropout must be a number"),
    (dict(dropout=True), TypeError, "lstm: dropout must be a number"),
    (dict(dropout=0.2, train=True, generator="seed"), TypeError, "lstm: generator must be None"),
    (dict(dropout=0.2, train=True, generator=-1), ValueError, "lstm: generator as a seed must be >= 0, got -1"),
])
def test_bad_dropout_arguments(kw, exc, msg):
    w = [np.zeros(s, np.float32) for s in [(8, 2), (8, 2), (8,), (8,)] * 2]
    with pytest.raises(exc) as e:
        dnnkit.lstm(np.zeros((3, 1, 2), np.float32), None, None, w, num_layers=2, **kw)
    assert msg in str(e.value)


# ------------------------------------------------------------------------------------------ recompute
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers,bidirectional,dropout", [(1, False, 0.0), (3, False, 0.0), (2, True, 0.0),
                                                          (3, True, 0.4)])
def test_recompute_gives_the_gradients_of_the_saving_forward(mode, layers, bidirectional, dropout):
    """recompute=True saves no gate activations (reserve_bytes counts only dropout masks) and its
    backward, which recomputes them layer by layer, returns what the saving path returns."""
    c = SeqCase(mode, 7, 3, 5, 6, layers, bidirectional, True, False, False, True, False, np.float32, 2, seed=21)
    x, h0, c0, weights = make_seq(c)
    kw = dict(num_layers=layers, bidirectional=bidirectional, train=True, dropout=dropout, generator=3)
    fwd = {"lstm": lambda **k: dnnkit.lstm(x, h0, c0, weights, **kw, **k),
           "gru": lambda **k: dnnkit.gru(x, h0, weights, **kw, **k)}.get(
        mode, lambda **k: dnnkit.rnn(x, h0, weights, nonlinearity=mode[4:], **kw, **k))
    go = np.random.default_rng(4).standard_normal((7, 3, c.D * 6)).astype(np.float32)
    results = []
    for recompute in (False, True):
        out, state, reserve = fwd(recompute=recompute)
        masks = reserve.dropout_masks
        expect_bytes = sum(m.nbytes for m in masks)
        if recompute:
            assert reserve.reserve_bytes == expect_bytes
        else:
            assert reserve.reserve_bytes > expect_bytes or mode.startswith("rnn_")
        results.append((out, run_backward(c, go, None, None, reserve)))
    (o0, g0), (o1, g1) = results
    assert np.array_equal(o0, o1)
    flat = lambda g: [a for v in g for a in (v if isinstance(v, list) else [v]) if a is not None]
    for a, b in zip(flat(g0), flat(g1)):
        assert a.shape == b.shape
        assert rel_l2(b, a) <= 1e-6


# ----------------------------------------------------------------------------------------- cell paths
from dnnkit import algos  # noqa: E402
from dnnkit.algos.rnn_cpu import CELL_PATHS, shape_tuple  # noqa: E402
from dnnkit.problem import RnnProblem  # noqa: E402
from dnnkit.reference import gru_cell_ref, lstm_cell_ref, rnn_cell_ref  # noqa: E402

CELL_PATH_CASES = [
    # (mode, B, I, H): one row; the dot kernel's 16 rows and past them; depths below and past the
    # strided-A kernel's threshold; H off the panel width
    ("lstm", 1, 7, 33), ("lstm", 16, 300, 48), ("gru", 20, 64, 40), ("gru", 3, 5, 9), ("rnn_tanh", 33, 400, 24),
    ("rnn_relu", 5, 2, 17),
]
CELL_FNS = {"lstm": dnnkit.lstm_cell, "gru": dnnkit.gru_cell, "rnn_tanh": dnnkit.rnn_tanh_cell,
            "rnn_relu": dnnkit.rnn_relu_cell}


def _cell_operands(mode, B, I, H, dtype, seed):
    rng = np.random.default_rng(seed)
    G = {"lstm": 4, "gru": 3}.get(mode, 1)
    k = 1 / np.sqrt(H)
    x, h, c = (rng.standard_normal(s).astype(dtype) for s in ((B, I), (B, H), (B, H)))
    w = [rng.uniform(-k, k, s).astype(dtype) for s in ((G * H, I), (G * H, H), (G * H,), (G * H,))]
    return x, h, c, w


def _cell_reference(mode, x, h, c, w):
    if mode == "lstm":
        return lstm_cell_ref(x, h, c, *w)[0]
    if mode == "gru":
        return gru_cell_ref(x, h, *w)
    return rnn_cell_ref(x, h, *w, nonlinearity=mode[4:])


@pytest.mark.parametrize("case", CELL_PATH_CASES, ids=lambda c: f"{c[0]}-B{c[1]}-I{c[2]}-H{c[3]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_cell_path_matches_the_reference(case, dtype):
    """Each path a cell's products can take (algo=fused_cell_*), where it can run the cell, gives the
    reference's h' (and c'), as the kernel's own choice does; one that cannot says why."""
    mode, B, I, H = case
    x, h, c, w = _cell_operands(mode, B, I, H, dtype, seed=B * 7 + H)
    expected = _cell_reference(mode, x.astype(np.float64), h.astype(np.float64), c.astype(np.float64),
                               [a.astype(np.float64) for a in w])
    p = RnnProblem(mode, 1, B, I, H, dtype=np.dtype(dtype).name)
    ran = []
    for name in ("fused", *CELL_PATHS):
        reason = algos.get(p.op, "cpu", name).supports(p)
        hx = (h, c) if mode == "lstm" else h
        if reason is not None:
            with pytest.raises(ValueError, match="cannot run"):
                CELL_FNS[mode](x, hx, *w, algo=name)
            continue
        out = CELL_FNS[mode](x, hx, *w, algo=name)
        got = out[0] if mode == "lstm" else out
        assert rel_l2(got, expected) <= tol(dtype, FWD_TOL32), name
        shape = shape_tuple(p, 0, CELL_PATHS.get(name, 0))
        if name != "fused":  # the kernel takes the path named
            assert dnnkit._cpu.rnn_cell_path(shape, np.dtype(dtype).itemsize) == CELL_PATHS[name]
        ran.append(name)
    assert {"fused", "fused_cell_gemm"} <= set(ran)
    assert ("fused_cell_dots" in ran) == (B <= 16)


def test_cell_paths_are_registered_tuned_and_explained(monkeypatch):
    """The cell paths are registry entries: explain() lists them with their rule, the tuner times each one
    that can run a cell, and untuned dispatch keeps the kernel's rule (fused)."""
    import os
    import tempfile

    from dnnkit.autotune import find

    monkeypatch.setenv("DNNKIT_CACHE_DIR", tempfile.mkdtemp())
    p = RnnProblem("lstm", 1, 4, 64, 32)
    rows = {c.algorithm: c for c in dnnkit.explain(p)}
    assert rows["fused"].chosen
    for name in CELL_PATHS:
        assert name in rows
        if rows[name].supported:
            assert "kernel's rule" in rows[name].rule and rows[name].predicted_s > 0
    timed = {r.algorithm for r in find(p, store=False, budget=0.02, prune=None) if r.ok}
    assert {"fused", "fused_cell_dots", "fused_cell_gemm"} <= timed
    assert not {n for n in CELL_PATHS if algos.get(p.op, "cpu", n).supports(RnnProblem("lstm", 5, 4, 64, 32)) is None}
    assert os.environ["DNNKIT_CACHE_DIR"]


def test_the_tiles_are_an_entry_of_their_own():
    """fused_amx (the products on AMX tiles whatever the batch) is a forward entry that says why it cannot
    run where there are no tiles, a projection or ReLU's unbounded state; its rule defers to fused; the
    kernel's shape takes the tile choice as its eleventh entry and rejects an unknown one."""
    from dnnkit.algos.rnn_cpu import shape_tuple
    from dnnkit.backends.cpu import ext

    names = {a.name for a in algos.algorithms("lstm_fwd", "cpu")}
    assert "fused_amx" in names and "fused_amx" not in {a.name for a in algos.algorithms("lstm_bwd", "cpu")}
    amx = algos.get("lstm_fwd", "cpu", "fused_amx")
    p = RnnProblem("lstm", 5, 64, 32, 32)
    assert "kernel's rule (fused)" in amx.rule(p)
    assert "float32 only" in amx.supports(RnnProblem("lstm", 5, 64, 32, 32, dtype="float64"))
    if not ext.amx_enabled():
        assert "AMX-BF16" in amx.supports(p)
    else:
        assert "projection" in amx.supports(RnnProblem("lstm", 5, 64, 32, 32, proj=16))
        assert "ReLU" in algos.get("rnn_relu_fwd", "cpu", "fused_amx").supports(RnnProblem("rnn_relu", 5, 64, 32, 32))
    with pytest.raises(ValueError, match="tiles must be in 0..2"):
        ext.rnn_cell_path(shape_tuple(p, 0, 0, 3), 4)
    assert [a.tiles for a in algos.algorithms("gru_fwd", "cpu")] == [
        0 if a.name == "fused" else 2 if a.name == "fused_amx" else 1 for a in algos.algorithms("gru_fwd", "cpu")]
