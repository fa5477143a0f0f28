"""Convolution: the float64 references checked on their own (naive loops, PyTorch when installed, the
adjoint identities of the backward passes), then dnnkit.conv2d / conv2d_backward_data /
conv2d_backward_filter / conv2d_backward_bias against them for every registered algorithm x dtype over
shapes: zero-size batch, groups and depthwise, odd sizes, non-square kernels, stride and padding larger
than the kernel, dilation, 'same'/'valid' padding, non-contiguous inputs; every ISA and thread count on
a fixed set; explain(). Bad input: test_conv_errors.py.

The tests of the public functions are skipped until dnnkit has them (dnnkit.conv2d and its backward
functions); the reference tests always run."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnkit
from dnnkit.problem import ConvProblem
from dnnkit.reference import (
    conv2d_backward_bias_ref, conv2d_backward_data_ref, conv2d_backward_filter_ref, conv2d_ref, rel_l2,
)
from helpers import DTYPES, FLOAT64_TOL

try:
    import torch
except ImportError:  # the references are still checked against naive loops and each other
    torch = None

PUBLIC = {"fwd": "conv2d", "bwd_data": "conv2d_backward_data", "bwd_filter": "conv2d_backward_filter"}
HAS_API = all(hasattr(dnnkit, f) for f in (*PUBLIC.values(), "conv2d_backward_bias"))
needs_api = pytest.mark.skipif(not HAS_API, reason="dnnkit has no conv2d / conv2d_backward_* yet")
ALGOS = {d: dnnkit.algos.algorithms(f"conv2d_{d}", "cpu") for d in PUBLIC}
KERNELS = [(1, 1), (3, 3), (5, 5), (1, 3), (3, 1), (2, 5)]
LAYOUTS = ("C", "channels_last", "strided")
EPS_RATIO = float(np.finfo(np.float64).eps / np.finfo(np.float32).eps)  # 2**-29


def conv_tolerance(algo, dtype) -> float:
    """Relative L2 bound for algo's output in dtype. float32: algo.tolerance. float64: FLOAT64_TOL, unless
    the algorithm states its own (tolerance_float64) or its float32 bound scaled by the ratio of the two
    precisions' epsilons is looser (Winograd's transforms amplify rounding alike in both precisions)."""
    if np.dtype(dtype) == np.float32:
        return algo.tolerance
    return getattr(algo, "tolerance_float64", max(FLOAT64_TOL, algo.tolerance * EPS_RATIO))


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# ----------------------------------------------------------------------------------------------- cases
@dataclass
class ConvCase:
    n: int
    c: int
    k: int
    h: int
    w: int
    r: int
    s: int
    groups: int
    stride: object  # int or pair
    padding: object  # int, pair, "same" or "valid"
    dilation: object  # int or pair
    dtype: type
    bias: bool
    layout: str
    seed: int

    @property
    def x_shape(self):
        return (self.n, self.c, self.h, self.w)

    @property
    def w_shape(self):
        return (self.k, self.c // self.groups, self.r, self.s)

    @property
    def args(self) -> dict:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)

    def torch_padding(self):
        """(top, bottom, left, right) padding of torch's semantics, 'same' included (the odd one extra at
        the bottom/right)."""
        if self.padding == "valid":
            return (0, 0, 0, 0)
        if self.padding == "same":
            (dh, dw) = _pair(self.dilation)
            th, tw = dh * (self.r - 1), dw * (self.s - 1)
            return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
        ph, pw = _pair(self.padding)
        return (ph, ph, pw, pw)


@st.composite
def conv_cases(draw, string_padding=True, max_hw=12):
    kind = draw(st.sampled_from(["dense", "groups2", "depthwise"]))
    if kind == "dense":
        groups, c, k = 1, draw(st.integers(1, 8)), draw(st.integers(1, 8))
    elif kind == "groups2":
        groups, c, k = 2, 2 * draw(st.integers(1, 4)), 2 * draw(st.integers(1, 4))
    else:  # depthwise, with a channel multiplier of 1 or 2
        c = draw(st.integers(1, 8))
        groups, k = c, c * draw(st.integers(1, 2))
    r, s = draw(st.sampled_from(KERNELS))
    int_or_pair = lambda lo, hi: st.one_of(st.integers(lo, hi), st.tuples(st.integers(lo, hi), st.integers(lo, hi)))
    stride, dilation = draw(int_or_pair(1, 3)), draw(int_or_pair(1, 2))
    if draw(st.integers(0, 7)) >= 5:  # the most common layer (and what Winograd runs) 3 times in 8
        r, s, stride, dilation = 3, 3, 1, 1
    padding = draw(st.one_of(st.integers(0, 3), st.tuples(st.integers(0, 3), st.integers(0, 3)),
                             *([st.sampled_from(["same", "valid"])] if string_padding else [])))
    if padding == "same":
        stride = draw(st.sampled_from([1, (1, 1)]))  # torch allows 'same' with stride 1 only
    case = ConvCase(0, c, k, 0, 0, r, s, groups, stride, padding, dilation, np.float32, False, "C", 0)
    top, bottom, left, right = case.torch_padding()
    (dh, dw) = _pair(dilation)
    min_h = max(1, dh * (r - 1) + 1 - top - bottom)  # the kernel fits the padded input
    min_w = max(1, dw * (s - 1) + 1 - left - right)
    case.h = draw(st.integers(min_h, max(min_h, max_hw)))
    case.w = draw(st.integers(min_w, max(min_w, max_hw)))
    case.n = draw(st.integers(0, 7).map(lambda i: 0 if i == 7 else 1 + i % 2))  # zero-size batch 1 time in 8
    case.dtype = draw(st.sampled_from(DTYPES))
    case.bias = draw(st.booleans())
    case.layout = draw(st.sampled_from(LAYOUTS))
    case.seed = draw(st.integers(0, 2**32 - 1))
    return case


def with_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """The values of the 4-D array a in another memory layout: C-contiguous (a copy), channels-last (a
    transposed view of an NHWC array), or every other column of a larger NaN-filled buffer (reading
    outside the view poisons the result)."""
    if layout == "C":
        return np.ascontiguousarray(a).copy()
    if layout == "channels_last":
        v = np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W)
    elif layout == "strided":
        n, c, h, w = a.shape
        buf = np.full((n, c, h, 2 * w + 1), np.nan, dtype=a.dtype)
        v = buf[..., 1::2]  # (N, C, H, W) view, stride 2 along W
    else:
        raise ValueError(layout)
    v[...] = a
    assert v.shape == a.shape
    return v


def arrays(case: ConvCase):
    """x, w, bias (or None), dy of the case, float64 values stored in case.dtype."""
    rng = np.random.default_rng(case.seed)
    top, bottom, left, right = case.torch_padding()
    (sh, sw), (dh, dw) = _pair(case.stride), _pair(case.dilation)
    p = (case.h + top + bottom - dh * (case.r - 1) - 1) // sh + 1
    q = (case.w + left + right - dw * (case.s - 1) - 1) // sw + 1
    x = rng.standard_normal(case.x_shape).astype(case.dtype)
    w = rng.standard_normal(case.w_shape).astype(case.dtype)
    b = rng.standard_normal(case.k).astype(case.dtype) if case.bias else None
    dy = rng.standard_normal((case.n, case.k, p, q)).astype(case.dtype)
    return x, w, b, dy


def expected_forward(case, x, w, b):
    """torch.nn.functional.conv2d semantics in float64, an asymmetric 'same' padding included."""
    top, bottom, left, right = case.torch_padding()
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    return conv2d_ref(xp, w, b, stride=case.stride, padding=0, dilation=case.dilation, groups=case.groups)


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
def _rejects(op, algo, reason, call):
    """algo cannot run the problem: asking for it by name is a ValueError naming op, algo and reason."""
    assert isinstance(reason, str) and reason, f"{algo.name}.supports() must return None or a non-empty reason"
    with pytest.raises(ValueError, match=rf"^{op}: .*{re.escape(algo.name)}.*{re.escape(reason)}"):
        call()


def _check_output(out, expected, dtype, algo, case):
    assert isinstance(out, np.ndarray) and out.dtype == dtype, f"{type(out)} {getattr(out, 'dtype', None)}"
    assert out.shape == expected.shape, f"shape {out.shape}, expected {expected.shape}"
    assert not np.isnan(out).any(), "NaN in the output: an element was not written or read outside an input"
    err = rel_l2(out, expected)
    assert err <= conv_tolerance(algo, dtype), f"relative L2 error {err:.3g} for {algo.name} on {case}"


def check_forward(algo, case: ConvCase):
    x0, w0, b0, _ = arrays(case)
    x, w = with_layout(x0, case.layout), with_layout(w0, case.layout)
    b = None if b0 is None else b0.copy()
    expected = expected_forward(case, x0, w0, b0)
    call = lambda: dnnkit.conv2d(x, w, b, **case.args, algo=algo.name)  # noqa: E731
    try:
        p = ConvProblem.from_arrays(case.x_shape, case.w_shape, **case.args, dtype=np.dtype(case.dtype).name,
                                    bias=b is not None)
    except ValueError as e:
        # 'same' with an odd total padding: a ConvProblem cannot hold it. conv2d may pad the input itself
        # (then it must match torch) or refuse, naming itself.
        assert "asymmetric 'same'" in str(e), str(e)
        try:
            out = call()
        except ValueError as refusal:
            assert str(refusal).startswith("conv2d: "), str(refusal)
            return
        _check_output(out, expected, case.dtype, algo, case)
        return
    assert p.output_shape == expected.shape
    reason = algo.supports(p)
    if reason is not None:
        _rejects("conv2d", algo, reason, call)
        return
    out = call()
    _check_output(out, expected, case.dtype, algo, case)
    assert np.array_equal(x, x0) and np.array_equal(w, w0), "conv2d modified its inputs"


def check_backward_data(algo, case: ConvCase):
    x0, w0, _, dy0 = arrays(case)
    w, dy = with_layout(w0, case.layout), with_layout(dy0, case.layout)
    expected = conv2d_backward_data_ref(case.x_shape, w0, dy0, **case.args)
    p = ConvProblem.from_arrays(case.x_shape, case.w_shape, **case.args, direction="bwd_data",
                                dtype=np.dtype(case.dtype).name, op="conv2d_backward_data")
    call = lambda: dnnkit.conv2d_backward_data(case.x_shape, w, dy, **case.args, algo=algo.name)  # noqa: E731
    reason = algo.supports(p)
    if reason is not None:
        _rejects("conv2d_backward_data", algo, reason, call)
        return
    out = call()
    _check_output(out, expected, case.dtype, algo, case)
    assert np.array_equal(w, w0) and np.array_equal(dy, dy0), "conv2d_backward_data modified its inputs"


def check_backward_filter(algo, case: ConvCase):
    x0, w0, _, dy0 = arrays(case)
    x, dy = with_layout(x0, case.layout), with_layout(dy0, case.layout)
    expected = conv2d_backward_filter_ref(x0, case.w_shape, dy0, **case.args)
    p = ConvProblem.from_arrays(case.x_shape, case.w_shape, **case.args, direction="bwd_filter",
                                dtype=np.dtype(case.dtype).name, op="conv2d_backward_filter")
    call = lambda: dnnkit.conv2d_backward_filter(x, case.w_shape, dy, **case.args, algo=algo.name)  # noqa: E731
    reason = algo.supports(p)
    if reason is not None:
        _rejects("conv2d_backward_filter", algo, reason, call)
        return
    out = call()
    _check_output(out, expected, case.dtype, algo, case)
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0), "conv2d_backward_filter modified its inputs"


CHECKS = {"fwd": check_forward, "bwd_data": check_backward_data, "bwd_filter": check_backward_filter}


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


def _fixed_cases():
    """A few layers a little larger than the hypothesis ones (several Winograd tiles and GEMM blocks,
    with tails): 3x3 same, 1x1, strided 3x3, grouped, depthwise, dilated."""
    cases = []
    for i, (n, c, k, h, w, r, s, g, stride, padding, dilation) in enumerate([
        (2, 16, 24, 15, 13, 3, 3, 1, 1, 1, 1),
        (1, 32, 20, 9, 11, 1, 1, 1, 1, 0, 1),
        (2, 8, 12, 17, 16, 3, 3, 1, 2, 1, 1),
        (1, 12, 18, 10, 10, 3, 3, 3, 1, 1, 1),
        (2, 10, 10, 12, 9, 3, 3, 10, 1, (1, 2), (1, 2)),
        (1, 6, 8, 14, 14, 5, 5, 1, 1, 4, 2),
    ]):
        for dtype in DTYPES:
            cases.append(ConvCase(n, c, k, h, w, r, s, g, stride, padding, dilation, dtype, True, "C", i))
    return cases


def _problem(case: ConvCase, direction: str) -> ConvProblem:
    return ConvProblem.from_arrays(case.x_shape, case.w_shape, **case.args, direction=direction,
                                   dtype=np.dtype(case.dtype).name, bias=direction == "fwd" and case.bias)


def _run_poisoned(algo, case: ConvCase, direction: str, p: ConvProblem):
    """algo called directly on case in direction, its output and workspace poisoned with NaN (scratch must
    be written before it is read), checked against the reference."""
    x, w, b, dy = arrays(case)
    dtype = np.dtype(case.dtype)
    nbytes = algo.workspace_bytes(p)
    workspace = np.full(nbytes // dtype.itemsize, np.nan, dtype) if nbytes else None
    if direction == "fwd":
        inputs, shape, extra = (x, w), p.output_shape, dict(bias=b)
        expected = expected_forward(case, x, w, b)
    elif direction == "bwd_data":
        inputs, shape, extra = (w, dy), p.input_shape, {}
        expected = conv2d_backward_data_ref(case.x_shape, w, dy, **case.args)
    else:
        inputs, shape, extra = (x, dy), p.weight_shape, {}
        expected = conv2d_backward_filter_ref(x, case.w_shape, dy, **case.args)
    out = np.full(shape, np.nan, dtype)
    algo.run(p, *inputs, out=out, workspace=workspace, **extra)
    _check_output(out, expected, dtype, algo, case)


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


WINOGRAD_EDGE_SHAPES = [
    # (n, c, k, h, w, groups, padding): both schedules and their boundaries
    (1, 24, 70, 6, 6, 1, 1),     # few tiles (9 for F(2x2), 4 for F(4x4)), two output-channel blocks, tails
    (1, 12, 40, 9, 7, 2, 1),     # few tiles per group, groups
    (1, 100, 40, 5, 5, 1, 1),    # few tiles, several input-channel blocks of U^T with a short last one
    (2, 3, 5, 1, 1, 1, 1),       # outputs smaller than a tile, one tile per image
    (1, 5, 7, 16, 16, 1, 1),     # exactly 64 tiles (F(2x2)): one whole chunk
    (1, 5, 7, 18, 16, 1, 1),     # 72 tiles: a chunk and a short one (threads share the chunks)
    (3, 6, 30, 20, 22, 3, 2),    # many chunks per group, a partial last chunk, padding 2
    (1, 7, 13, 4, 5, 1, 0),      # valid padding, a 2x3 output
    (1, 4, 100, 40, 40, 1, 1),   # chunked, with more output channels than one M block (blocks on MR panels)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_winograd_schedules_and_chunk_boundaries(isa, num_threads, dtype):
    """Winograd's chunked and few-tiles schedules on shapes around their boundaries, on every ISA's
    micro-kernel (MR, NR) and thread count, with the output and the workspace poisoned with NaN."""
    _winograd_schedules("fwd", WINOGRAD_EDGE_SHAPES, dtype, True, 100)


def _winograd_schedules(direction, shapes, dtype, bias, seed):
    """Every Winograd algorithm of direction on the 3x3 stride-1 shapes (n, c, k, h, w, groups, padding),
    which it must support, through _run_poisoned."""
    for algo in (a for a in ALGOS[direction] if a.name.startswith("winograd")):
        for i, (n, c, k, h, w, g, pad) in enumerate(shapes):
            case = ConvCase(n, c, k, h, w, 3, 3, g, 1, pad, 1, dtype, bias, "C", seed + i)
            p = _problem(case, direction)
            assert algo.supports(p) is None
            _run_poisoned(algo, case, direction, p)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_winograd_backward_data_schedules(isa, num_threads, dtype):
    """Backward data by Winograd (the forward pass on dy with the filters turned, at padding 2 - p) on the
    same shapes, on every ISA and thread count, output and workspace poisoned with NaN; padding 3 is
    refused with its reason."""
    _winograd_schedules("bwd_data", WINOGRAD_EDGE_SHAPES, dtype, False, 150)
    p3 = ConvProblem.parse("mb1ic4ih5oc4oh9kh3ph3", direction="bwd_data")
    for algo in (a for a in ALGOS["bwd_data"] if a.name.startswith("winograd")):
        assert "padding at most 2" in algo.supports(p3)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_winograd_backward_filter_schedules(isa, num_threads, dtype):
    """Backward filter by Winograd (the transposed algorithm, tiles as the GEMM's depth in chunks of 256)
    on the same shapes and on more tiles than one chunk, on every ISA and thread count, output and
    workspace poisoned with NaN."""
    shapes = WINOGRAD_EDGE_SHAPES + [(3, 6, 9, 48, 40, 1, 1),    # 360 tiles (F(4x4)), 1440 (F(2x2)): 2 and 6 chunks
                                     (1, 33, 5, 44, 23, 1, 2)]    # 84 tiles (F(4x4)), 299 (F(2x2)): 1 and 2 chunks
    _winograd_schedules("bwd_filter", shapes, dtype, False, 170)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_pointwise_images_side_by_side(isa, num_threads, dtype):
    """1x1 stride-1 convolutions on small planes, forward and backward data, several images in one GEMM
    whose B is packed straight from the input (gradient) planes: panels that straddle two or more images (planes of 1, 5x5, 3x7 pixels against
    every micro-kernel's NR), groups, a batch that does not fill the last chunk, strided input."""
    algo = next(a for a in ALGOS["fwd"] if a.name == "im2col_gemm")
    bwd = next(a for a in ALGOS["bwd_data"] if a.name == "gemm_col2im")  # the same batching, gradient planes
    for i, (n, c, k, h, w, g, layout) in enumerate([(3, 5, 7, 5, 5, 1, "C"), (5, 4, 9, 3, 7, 1, "strided"),
                                                    (9, 6, 4, 1, 1, 2, "C"), (4, 8, 8, 6, 5, 4, "C"),
                                                    (6, 9, 3, 4, 4, 1, "C")]):
        case = ConvCase(n, c, k, h, w, 1, 1, g, 1, 0, 1, dtype, True, layout, 200 + i)
        check_forward(algo, case)
        check_backward_data(bwd, case)


def test_backward_filter_threads_columns_in_chunks_of_whole_rows():
    """im2col_gemm's backward filter where the threads take whole images (a small dW) and one image's
    columns exceed a quarter of a thread's share of L3: each image in chunks of whole output rows
    (conv.h), the last one shorter, summed into the same dW as one chunk would give."""
    l3 = dnnkit._cpu.l3_cache_bytes()
    crs, itemsize = 8 * 7 * 7, 8
    fit = l3 // (4 * 2 * crs * itemsize)  # columns a chunk holds on two threads
    side = int(np.ceil(np.sqrt(1.5 * fit))) + 1  # a plane of about 1.5 chunks: P = H at padding 3
    if not l3 or side > 160:
        pytest.skip(f"an L3 of {l3} bytes needs too large a plane for this test")
    algo = next(a for a in ALGOS["bwd_filter"] if a.name == "im2col_gemm")
    before = dnnkit.get_num_threads()
    try:
        dnnkit.set_num_threads(2)
        check_backward_filter(algo, ConvCase(2, 8, 4, side, side + 1, 7, 7, 1, 1, 3, 1, np.float64, False, "C", 500))
    finally:
        dnnkit.set_num_threads(before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_backward_data_images_side_by_side_before_col2im(isa, num_threads, dtype):
    """gemm_col2im's backward data on small planes of kernels other than 1x1 stride 1: the columns of
    several images side by side (one GEMM whose B is packed from their gradient planes), then col2im
    image by image from its part of them. 3x3 with padding, 1x1 stride 2 (input pixels no column covers),
    dilation and groups, a plane of one pixel, strided input, and a workspace limit that leaves a last
    chunk of fewer images."""
    algo = next(a for a in ALGOS["bwd_data"] if a.name == "gemm_col2im")
    shapes = [  # n, c, k, h, w, r, groups, stride, padding, dilation, layout
        (5, 4, 6, 5, 5, 3, 1, 1, 1, 1, "C"), (4, 6, 8, 7, 6, 1, 2, 2, 0, 1, "strided"),
        (3, 4, 6, 7, 7, 3, 2, 1, 2, 2, "C"), (6, 3, 5, 3, 3, 3, 1, 1, 0, 1, "C")]
    cases = [ConvCase(n, c, k, h, w, r, r, g, stride, pad, dil, dtype, False, layout, 400 + i)
             for i, (n, c, k, h, w, r, g, stride, pad, dil, layout) in enumerate(shapes)]
    for case in cases:
        p = _problem(case, "bwd_data")
        assert algo.chunk(p) >= 2 * p.oh * p.ow  # images side by side
        check_backward_data(algo, case)
    before = dnnkit.get_workspace_limit()
    try:  # two images a chunk of the first shape (CRS 36 + 6 output rows, 25 pixels): chunks of 2, 2 and 1
        dnnkit.set_workspace_limit(2 * np.dtype(dtype).itemsize * (36 + 6) * 25)
        assert algo.chunk(_problem(cases[0], "bwd_data")) == 2 * 25
        check_backward_data(algo, cases[0])
    finally:
        dnnkit.set_workspace_limit(before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_forward_strided_1x1_columns(isa, num_threads, dtype):
    """im2col_gemm's forward on 1x1 filters without padding at strides other than 1, whose columns sample
    the input in place (no bounds test): output rows of fewer and more than 8 pixels (the stride-2 copy's
    vectors), odd strides, groups, small planes of several images side by side, a strided input, and a
    workspace limit that starts chunks in the middle of an output row."""
    algo = next(a for a in ALGOS["fwd"] if a.name == "im2col_gemm")
    shapes = [  # n, c, k, h, w, groups, stride, layout
        (3, 5, 6, 13, 14, 1, 2, "C"), (2, 4, 6, 9, 37, 2, 2, "strided"), (1, 3, 5, 11, 40, 1, (3, 2), "C"),
        (2, 6, 9, 10, 9, 3, (2, 3), "C"), (4, 8, 7, 7, 7, 1, 2, "C")]
    cases = [ConvCase(n, c, k, h, w, 1, 1, g, stride, 0, 1, dtype, True, layout, 600 + i)
             for i, (n, c, k, h, w, g, stride, layout) in enumerate(shapes)]
    for case in cases:
        check_forward(algo, case)
    before = dnnkit.get_workspace_limit()
    try:  # the third shape (3 x 4 x 20 output, CRS 3): chunks of 7 pixels, most starting mid-row
        dnnkit.set_workspace_limit(7 * 3 * np.dtype(dtype).itemsize)
        assert algo.chunk(_problem(cases[2], "fwd")) == 7
        check_forward(algo, cases[2])
    finally:
        dnnkit.set_workspace_limit(before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_backward_filter_images_side_by_side_along_the_depth(isa, num_threads, dtype):
    """im2col_gemm's backward filter on planes under 128 pixels: several images' dY rows and columns
    gathered along one product's depth (conv.h, Batching::depth). 1x1 (the planes copied), 1x1 stride 2
    and 3x3 (im2col per image), groups, a dW over the size threads keep private copies of (so the shared
    path runs on two threads too), and a workspace limit that leaves a last chunk of fewer images."""
    algo = next(a for a in ALGOS["bwd_filter"] if a.name == "im2col_gemm")
    shapes = [  # n, c, k, h, w, r, groups, stride, padding, layout
        (5, 6, 8, 5, 5, 1, 1, 1, 0, "C"), (4, 8, 6, 7, 6, 1, 2, 2, 0, "strided"), (3, 4, 5, 6, 6, 3, 1, 1, 1, "C"),
        (3, 300, 230, 3, 3, 1, 1, 1, 0, "C"), (6, 4, 6, 1, 1, 1, 2, 1, 0, "C")]
    cases = [ConvCase(n, c, k, h, w, r, r, g, stride, pad, 1, dtype, False, layout, 300 + i)
             for i, (n, c, k, h, w, r, g, stride, pad, layout) in enumerate(shapes)]
    for case in cases:
        check_backward_filter(algo, case)
    before = dnnkit.get_workspace_limit()
    try:  # two images a chunk of the first shape (8 + 6 values a pixel): chunks of 2, 2 and 1
        dnnkit.set_workspace_limit(2 * np.dtype(dtype).itemsize * (8 + 6) * 25)
        if num_threads == 1:
            assert algo.chunk(_problem(cases[0], "bwd_filter")) == 2 * 25
            check_backward_filter(algo, cases[0])
    finally:
        dnnkit.set_workspace_limit(before)
    if num_threads == 1:
        assert algo.chunk(_problem(cases[0], "bwd_filter")) == 5 * 25  # all five images in one product
    assert algo.chunk(_problem(cases[3], "bwd_filter")) == 3 * 9  # dW of 69,000 values: shared


# (n, c, k, h, w, r, s, groups, stride, padding, dilation): implicit_gemm's B panels against its runs
IMPLICIT_EDGE_SHAPES = [
    (3, 4, 5, 6, 1, 3, 1, 1, 1, (1, 0), 1),     # one output column: every panel column its own run
    (2, 40, 6, 5, 7, 3, 3, 1, 1, 1, 1),         # 360-deep columns: more than one k block
    (5, 6, 4, 4, 8, 3, 3, 2, 1, 1, 1),          # a 4x8 plane (32 pixels), groups, batch not a multiple of 2
    (1, 3, 7, 3, 11, 2, 3, 1, 1, (0, 1), 1),    # 33 pixels in runs of 11, one image on all threads
    (2, 5, 3, 9, 9, 3, 3, 1, (2, 3), 4, (2, 1)),  # stride, dilation, padding wider than the filter
    (2, 2, 3, 2, 2, 5, 5, 1, 1, 3, 1),          # mostly padding
    (3, 3, 4, 5, 7, 3, 3, 1, 1, 0, 1),          # no padding: the input itself, its last run copied exactly
    (2, 6, 9, 9, 6, 1, 1, 3, (2, 1), 0, 1),     # 1x1 with stride, groups, no padding
    (3, 2, 2100, 3, 4, 1, 2, 1, 1, 1, 1),       # more output channels than one M block of packed filters
    (2, 3, 4, 9, 40, 3, 3, 1, 2, 1, 1),         # stride 2 along rows of 20 outputs: the vector gather
    (1, 2, 3, 5, 41, 1, 1, 1, 2, 0, 1),         # stride 2, no padding: the last run ends at x's last element
    (1, 2, 3, 5, 31, 1, 1, 1, 2, 0, 1),         # rows of 16 outputs, each a whole vector block, the last at x's end
    (1, 2, 3, 5, 15, 1, 1, 1, 2, 0, 1),         # rows of 8 outputs (a float32 block, two float64 ones)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_implicit_gemm_panels_and_threads(isa, num_threads, dtype):
    """implicit_gemm's packing of the columns straight from the padded image, on every ISA's NR and
    thread count: output rows split across panels, one-column rows, deep columns, strides, dilation and
    padding wider than the filter, the per-thread and all-thread schedules, filters packed in more than
    one block; output and workspace poisoned with NaN."""
    algo = next(a for a in ALGOS["fwd"] if a.name == "implicit_gemm")
    for i, (n, c, k, h, w, r, s, g, stride, pad, dil) in enumerate(IMPLICIT_EDGE_SHAPES):
        case = ConvCase(n, c, k, h, w, r, s, g, stride, pad, dil, dtype, True, "C", 300 + i)
        x, wt, b, _ = arrays(case)
        p = ConvProblem.from_arrays(case.x_shape, case.w_shape, **case.args, dtype=np.dtype(dtype).name, bias=True)
        # odd cases: a workspace that starts off the 64-byte alignment the packed filters are placed at
        nelems = algo.workspace_bytes(p) // np.dtype(dtype).itemsize
        workspace = np.full(nelems + 1, np.nan, dtype)[i % 2:][:nelems]
        out = np.full(p.output_shape, np.nan, dtype)
        algo.run(p, x, wt, out=out, bias=b, workspace=workspace)
        _check_output(out, expected_forward(case, x, wt, b), np.dtype(dtype), algo, case)


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
