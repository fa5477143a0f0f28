"""The convolution tests' shared cases: ConvCase and its hypothesis strategy, its arrays in several memory
layouts, the expected outputs and tolerances, the public functions checked on a case against the float64
references, a fixed set of larger layers, and an algorithm run directly on NaN-poisoned outputs and
workspaces (test_conv.py, test_conv_schedules.py)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import strategies as st

import dnnkit
from dnnkit.problem import ConvProblem
from dnnkit.reference import conv2d_backward_data_ref, conv2d_backward_filter_ref, conv2d_ref, rel_l2
from helpers import DTYPES, FLOAT64_TOL

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
