"""Convolution: the float64 references checked on their own (naive loops, PyTorch when installed, the
adjoint identities of the backward passes), then dnnkit.conv2d / conv2d_backward_data /
conv2d_backward_filter / conv2d_backward_bias against them for every registered algorithm x dtype over
shapes: zero-size batch, groups and depthwise, odd sizes, non-square kernels, stride and padding larger
than the kernel, dilation, 'same'/'valid' padding, non-contiguous inputs; every ISA and thread count on
a fixed set; explain(). Shapes around the algorithms' schedules: test_conv_schedules.py; bad input:
test_conv_errors.py; the cases: conv_cases.py.

The tests of the public functions are skipped until dnnkit has them (dnnkit.conv2d and its backward
functions); the reference tests always run."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import dnnkit
from conv_cases import (
    ALGOS, CHECKS, LAYOUTS, PUBLIC, ConvCase, _fixed_cases, _pair, _problem, _run_poisoned, arrays, check_backward_data,
    check_backward_filter, check_forward, conv_cases, conv_tolerance, expected_forward, needs_api, with_layout,
)
from dnnkit.problem import ConvProblem
from dnnkit.reference import (
    conv2d_backward_bias_ref, conv2d_backward_data_ref, conv2d_backward_filter_ref, conv2d_ref, rel_l2,
)
from helpers import DTYPES, FLOAT64_TOL

try:
    import torch
except ImportError:  # the references are still checked against naive loops and each other
    torch = None

# ------------------------------------------------------------------------------------- the references
def naive_conv2d(x, w, stride, padding, dilation, groups):
    """conv2d by its definition, one output element at a time (slow: tiny shapes only)."""
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    Kg = K // groups
    P = (H + 2 * ph - dh * (R - 1) - 1) // sh + 1
    Q = (W + 2 * pw - dw * (S - 1) - 1) // sw + 1
    y = np.zeros((N, K, P, Q))
    for n in range(N):
        for k in range(K):
            g = k // Kg
            for p in range(P):
                for q in range(Q):
                    acc = 0.0
                    for c in range(Cg):
                        for r in range(R):
                            for s in range(S):
                                i, j = p * sh - ph + r * dh, q * sw - pw + s * dw
                                if 0 <= i < H and 0 <= j < W:
                                    acc += float(x[n, g * Cg + c, i, j]) * float(w[k, c, r, s])
                    y[n, k, p, q] = acc
    return y




@settings(max_examples=25)
@given(case=conv_cases(string_padding=False, max_hw=6))
def test_conv2d_ref_matches_naive_loops(case):
    x, w, b, _ = arrays(case)
    expect = naive_conv2d(x, w, case.stride, case.padding, case.dilation, case.groups)
    if b is not None:
        expect += b.astype(np.float64)[None, :, None, None]
    got = conv2d_ref(x, w, b, **case.args)
    assert got.dtype == np.float64 and got.shape == expect.shape
    assert rel_l2(got, expect) <= 1e-13


@given(case=conv_cases(string_padding=False))
def test_conv_backward_refs_are_adjoints(case):
    """conv2d is bilinear, so its gradients are its adjoints: <conv(x, w), dy> == <x, bwd_data(w, dy)>
    == <w, bwd_filter(x, dy)>, and the bias gradient gives <b, bwd_bias(dy)> for the bias term."""
    x, w, b, dy = arrays(case)
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    y = conv2d_ref(x, w, **case.args)
    assert y.shape == dy.shape
    dx = conv2d_backward_data_ref(x.shape, w, dy, **case.args)
    dw = conv2d_backward_filter_ref(x, w.shape, dy, **case.args)
    assert dx.shape == x.shape and dw.shape == w.shape
    lhs = float(np.sum(y * dy))
    scale = np.linalg.norm(y) * np.linalg.norm(dy) + 1e-300
    assert abs(lhs - float(np.sum(x * dx))) <= 1e-12 * scale
    assert abs(lhs - float(np.sum(w * dw))) <= 1e-12 * scale
    if b is not None:
        yb = conv2d_ref(x, w, b, **case.args)
        db = conv2d_backward_bias_ref(dy)
        assert db.shape == (case.k,)
        assert abs(float(np.sum((yb - y) * dy)) - float(np.sum(b * db))) <= 1e-12 * (scale + np.abs(b).sum() *
                                                                                      np.abs(dy).sum())


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@given(case=conv_cases(string_padding=False))
def test_conv_refs_match_torch(case):
    x, w, b, dy = (None if a is None else torch.from_numpy(a.astype(np.float64)) for a in arrays(case))
    kw = dict(stride=_pair(case.stride), padding=_pair(case.padding), dilation=_pair(case.dilation),
              groups=case.groups)
    y = torch.nn.functional.conv2d(x, w, b, **kw).numpy()
    assert rel_l2(conv2d_ref(x.numpy(), w.numpy(), None if b is None else b.numpy(), **case.args), y) <= 1e-13
    dx = torch.nn.grad.conv2d_input(case.x_shape, w, dy, **kw).numpy()
    assert rel_l2(conv2d_backward_data_ref(case.x_shape, w.numpy(), dy.numpy(), **case.args), dx) <= 1e-13
    dw = torch.nn.grad.conv2d_weight(x, case.w_shape, dy, **kw).numpy()
    assert rel_l2(conv2d_backward_filter_ref(x.numpy(), case.w_shape, dy.numpy(), **case.args), dw) <= 1e-13


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
def test_expected_forward_same_padding_matches_torch():
    """The asymmetric 'same' padding of the test's own oracle is torch's."""
    if torch is None:
        pytest.skip("PyTorch is not installed")
    case = ConvCase(2, 3, 4, 7, 6, 2, 5, 1, 1, "same", (3, 1), np.float64, True, "C", 5)
    x, w, b, _ = arrays(case)
    y = torch.nn.functional.conv2d(*(torch.from_numpy(a) for a in (x, w, b)), padding="same", dilation=(3, 1))
    assert rel_l2(expected_forward(case, x, w, b), y.numpy()) <= 1e-13


def test_conv2d_backward_bias_ref():
    dy = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    assert np.array_equal(conv2d_backward_bias_ref(dy), dy.astype(np.float64).sum(axis=(0, 2, 3)))
    assert np.array_equal(conv2d_backward_bias_ref(np.zeros((0, 3, 4, 5))), np.zeros(3))


def test_torch_argument_forms():
    """A one-int tuple stands for both dimensions, as torch takes it; the bias gradient of an unbatched
    output."""
    x, w = np.ones((1, 2, 7, 7), np.float32), np.ones((3, 2, 3, 3), np.float32)
    assert np.array_equal(dnnkit.conv2d(x, w, stride=(2,), padding=[1], dilation=(1,)),
                          dnnkit.conv2d(x, w, stride=2, padding=1))
    y = np.arange(3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5)
    assert np.array_equal(dnnkit.conv2d_backward_bias(y), y.sum(axis=(1, 2)))


# -------------------------------------------------------------------------------- the public functions


@needs_api
@pytest.mark.parametrize("algo", ALGOS["fwd"], ids=lambda a: a.name)
@given(case=conv_cases())
def test_conv2d_matches_reference(algo, case):
    check_forward(algo, case)


@needs_api
@pytest.mark.parametrize("algo", ALGOS["bwd_data"], ids=lambda a: a.name)
@given(case=conv_cases(string_padding=False))
def test_conv2d_backward_data_matches_reference(algo, case):
    check_backward_data(algo, case)


@needs_api
@pytest.mark.parametrize("algo", ALGOS["bwd_filter"], ids=lambda a: a.name)
@given(case=conv_cases(string_padding=False))
def test_conv2d_backward_filter_matches_reference(algo, case):
    check_backward_filter(algo, case)


@pytest.mark.parametrize("direction", list(PUBLIC))
def test_algorithms_write_every_output_element(direction):
    """Each registered algorithm, called directly: an output poisoned with NaN and a workspace poisoned
    with NaN (scratch must be written before it is read) give the reference's result, zero batch included."""
    cases = _fixed_cases() + [ConvCase(0, 4, 6, 5, 5, 3, 3, 2, 1, 1, 1, dt, True, "C", 3) for dt in DTYPES]
    for algo in ALGOS[direction]:
        for case in cases:
            p = _problem(case, direction)
            if algo.supports(p) is not None:
                continue
            _run_poisoned(algo, case, direction, p)


@needs_api
def test_winograd_workspace_limit_too_small_is_a_reason():
    """Under a workspace limit smaller than one chunk per thread, Winograd is rejected with the amount it
    needs, and 'auto' still runs an algorithm that fits."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 9, 9)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    before = dnnkit.get_workspace_limit()
    try:
        dnnkit.set_workspace_limit(1024)
        with pytest.raises(ValueError, match="workspace"):
            dnnkit.conv2d(x, w, padding=1, algo="winograd_f4x4_3x3")
        y = dnnkit.conv2d(x, w, padding=1)
    finally:
        dnnkit.set_workspace_limit(before)
    assert rel_l2(y, conv2d_ref(x, w, padding=1)) <= 1e-5


@needs_api
@pytest.mark.parametrize("direction", list(PUBLIC))
def test_conv_every_isa_and_thread_count(isa, num_threads, direction):
    for algo in ALGOS[direction]:
        for case in _fixed_cases():
            CHECKS[direction](algo, case)


@needs_api
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_conv_auto_and_bias_gradient(dtype):
    """algo='auto' (the default) dispatches to a working algorithm in every direction; the bias gradient
    is dy summed over N, P and Q, zero-size batch included."""
    for i, case in enumerate(_fixed_cases()[::2] + [ConvCase(0, 4, 6, 5, 5, 3, 3, 2, 1, 1, 1, dtype, True, "C", 9)]):
        case.dtype = dtype
        x, w, b, dy = arrays(case)
        tol = max(conv_tolerance(a, dtype) for d in PUBLIC for a in ALGOS[d])
        assert rel_l2(dnnkit.conv2d(x, w, b, **case.args), expected_forward(case, x, w, b)) <= tol
        assert rel_l2(dnnkit.conv2d_backward_data(x.shape, w, dy, **case.args),
                      conv2d_backward_data_ref(x.shape, w, dy, **case.args)) <= tol
        assert rel_l2(dnnkit.conv2d_backward_filter(x, w.shape, dy, **case.args),
                      conv2d_backward_filter_ref(x, w.shape, dy, **case.args)) <= tol
        db = dnnkit.conv2d_backward_bias(with_layout(dy, LAYOUTS[i % len(LAYOUTS)]))
        assert db.shape == (case.k,) and db.dtype == dtype
        assert rel_l2(db, conv2d_backward_bias_ref(dy)) <= (1e-6 if dtype == np.float32 else FLOAT64_TOL)


@needs_api
def test_conv2d_zero_batch_and_same_padding_shapes():
    x = np.ones((0, 3, 7, 6), np.float32)
    w = np.ones((4, 3, 3, 5), np.float32)
    assert dnnkit.conv2d(x, w, padding="same").shape == (0, 4, 7, 6)
    assert dnnkit.conv2d(x, w, padding="valid").shape == (0, 4, 5, 2)
    assert dnnkit.conv2d_backward_data((0, 3, 7, 6), w, np.ones((0, 4, 5, 2), np.float32)).shape == (0, 3, 7, 6)
    dw = dnnkit.conv2d_backward_filter(x, w.shape, np.ones((0, 4, 5, 2), np.float32))
    assert dw.shape == w.shape and not dw.any()


@needs_api
@pytest.mark.parametrize("padding", [1, "same", (0, 2)])
def test_conv2d_unbatched_input(padding):
    """torch's unbatched input, C x H x W: the result K x P x Q, the first image of the batched call's."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((5, 3, 4, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    for _ in range(2):  # the second call through the remembered dispatch
        y = dnnkit.conv2d(x, w, b, padding=padding)
        want = dnnkit.conv2d(x[None], w, b, padding=padding)[0]
        assert y.shape == want.shape and y.flags.c_contiguous and np.array_equal(y, want)
    assert dnnkit.explain("conv2d", x, w, padding=1).problem.mb == 1
    for shape in [(9, 8), (1, 1, 3, 9, 8)]:
        with pytest.raises(ValueError, match=r"conv2d: input must be 3-D or 4-D"):
            dnnkit.conv2d(np.zeros(shape, np.float32), w)


@needs_api
def test_explain_conv2d_lists_every_forward_algorithm():
    if not hasattr(dnnkit, "explain"):
        pytest.skip("no dnnkit.explain")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    for w_shape, kwargs in [((8, 4, 3, 3), dict(padding=1)), ((8, 2, 5, 5), dict(stride=2, dilation=2, groups=2))]:
        w = rng.standard_normal(w_shape).astype(np.float32)
        try:
            ex = dnnkit.explain("conv2d", x, w, **kwargs)
        except ValueError as e:
            if "GemmProblem" in str(e):
                pytest.skip("explain() does not know conv2d yet")
            raise
        p = ConvProblem.from_arrays(x.shape, w.shape, **kwargs)
        assert ex.problem.op == "conv2d_fwd" and ex.problem.descriptor() == p.descriptor()
        assert [c.algorithm for c in ex] == [a.name for a in ALGOS["fwd"]]
        for c, a in zip(ex, ALGOS["fwd"]):
            reason = a.supports(p)
            if reason is not None:
                assert not c.supported and c.reason == reason and reason in str(ex)
            elif c.supported:
                assert c.reason is None
            else:  # supported by the algorithm, rejected for its workspace
                assert "workspace" in c.reason
        assert sum(c.chosen for c in ex) == 1


@pytest.mark.parametrize("kernel,dilation", [((4, 4), 1), ((2, 3), 1), ((3, 2), (2, 3)), ((4, 3), (1, 2))])
def test_same_padding_with_an_odd_total_pads_one_more_on_the_bottom_right(kernel, dilation):
    """torch's padding='same' where dilation * (kernel - 1) is odd: one more row/column of padding on the
    bottom/right than on the top/left, in all three directions."""
    rng = np.random.default_rng(sum(kernel))
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((5, 4) + kernel).astype(np.float32)
    dy = rng.standard_normal((2, 5, 7, 6)).astype(np.float32)
    d = (dilation, dilation) if isinstance(dilation, int) else dilation
    total = [d[i] * (kernel[i] - 1) for i in range(2)]
    pads = ((0, 0), (0, 0), (total[0] // 2, total[0] - total[0] // 2), (total[1] // 2, total[1] - total[1] // 2))
    xp = np.pad(x, pads)
    y = dnnkit.conv2d(x, w, padding="same", dilation=dilation)
    assert y.shape == (2, 5, 7, 6)
    assert rel_l2(y, conv2d_ref(xp, w, dilation=dilation)) <= 1e-5
    dx = dnnkit.conv2d_backward_data(x.shape, w, dy, padding="same", dilation=dilation)
    dxp = conv2d_backward_data_ref(xp.shape, w, dy, dilation=dilation)
    assert rel_l2(dx, dxp[:, :, pads[2][0]:pads[2][0] + 7, pads[3][0]:pads[3][0] + 6]) <= 1e-5
    dw = dnnkit.conv2d_backward_filter(x, w.shape, dy, padding="same", dilation=dilation)
    assert rel_l2(dw, conv2d_backward_filter_ref(xp, w.shape, dy, dilation=dilation)) <= 1e-5


@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_a_workspace_the_caller_owns(direction):
    """workspace=: the named algorithm runs in the caller's array (the same result as in dnnkit's own);
    "auto" picks among the algorithms that fit in it; too small, not an array, or sharing memory with an
    input (whole or in part) is an error naming it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    name = {"fwd": "conv2d", "bwd_data": "conv2d_backward_data", "bwd_filter": "conv2d_backward_filter"}[direction]
    call = {"fwd": lambda **kw: dnnkit.conv2d(x, w, padding=1, **kw),
            "bwd_data": lambda **kw: dnnkit.conv2d_backward_data(x.shape, w, dy, padding=1, **kw),
            "bwd_filter": lambda **kw: dnnkit.conv2d_backward_filter(x, w.shape, dy, padding=1, **kw)}[direction]
    algo = "winograd_f4x4_3x3"
    ws = np.full(1 << 22, 0xAB, np.uint8)
    assert np.array_equal(call(algo=algo, workspace=ws), call(algo=algo))
    assert (ws != 0xAB).any()  # the algorithm's scratch went there
    with pytest.raises(ValueError, match=f"^{name}: .*{algo}.*workspace"):
        call(algo=algo, workspace=np.empty(16, np.uint8))
    none = call(workspace=np.empty(0, np.float32))  # auto: an algorithm that needs no workspace
    assert rel_l2(none, call()) <= 1e-5
    with pytest.raises(TypeError, match=f"^{name}: workspace must be a NumPy array"):
        call(workspace=[0] * 1024)
    with pytest.raises(ValueError, match=f"^{name}: workspace must be a C-contiguous"):
        call(workspace=np.empty((64, 64), np.float32)[:, ::2])
    arrays = {"fwd": (("input", x), ("weight", w)), "bwd_data": (("weight", w), ("grad_output", dy)),
              "bwd_filter": (("input", x), ("grad_output", dy))}[direction]
    for arg, a in arrays:
        before = a.copy()
        with pytest.raises(ValueError, match=f"^{name}: workspace overlaps {arg}"):
            call(workspace=a if arg == arrays[0][0] else a[1:].reshape(-1).view(np.uint8))  # whole, or a part
        assert np.array_equal(a, before)  # refused before anything ran


@needs_api
def test_repeated_conv2d_calls_reuse_the_dispatch_and_still_check_their_inputs():
    """A repeated conv2d signature skips validation and dispatch: results as the first call's on inputs of
    any layout, and arguments that differ (a bias of another size, a stride of another type, a workspace)
    still go through every check."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    expected = conv2d_ref(x, w, b, stride=2, padding=1)
    for _ in range(2):
        assert rel_l2(dnnkit.conv2d(x, w, b, stride=2, padding=1), expected) <= 1e-5
        assert rel_l2(dnnkit.conv2d(x, w, b, stride=(2, 2), padding=[1, 1]), expected) <= 1e-5
    xf = np.asfortranarray(x)  # the same signature, other strides
    assert rel_l2(dnnkit.conv2d(xf, w, b, stride=2, padding=1), expected) <= 1e-5
    w2 = rng.standard_normal((6, 4, 2, 2)).astype(np.float32)
    first = dnnkit.conv2d(x, w2, padding="same")  # an even filter: one more row and column bottom/right
    assert first.shape == (2, 6, 9, 8) and np.array_equal(dnnkit.conv2d(x, w2, padding="same"), first)
    with pytest.raises(ValueError, match="conv2d: bias must have 6 elements"):
        dnnkit.conv2d(x, w, b[:5], stride=2, padding=1)
    with pytest.raises(TypeError, match="conv2d: stride"):
        dnnkit.conv2d(x, w, b, stride=True, padding=1)
    with pytest.raises(TypeError, match="conv2d: .*dtype"):
        dnnkit.conv2d(x.astype(np.float64), w, b, stride=2, padding=1)
    with pytest.raises(ValueError, match="conv2d: workspace"):
        dnnkit.conv2d(x, w, b, stride=2, padding=1, workspace=np.zeros(4, np.float32)[::2])
