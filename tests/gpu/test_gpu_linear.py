"""Fully-connected layers on the GPU: dnnkit.linear and linear_backward given device arrays, against the
float64 references: bias and every activation fused, the preactivation, leading dimensions, gradients
from the output or the preactivation, accumulate_into, and the errors."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")
from hypothesis import given, settings, strategies as st  # noqa: E402

import dnnkit  # noqa: E402
from dnnkit import reference as ref  # noqa: E402
from gpu_helpers import close, dev, host, rand  # noqa: E402

ACTS = [None, "relu", "tanh", "sigmoid", "gelu"]


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_forward(activation, dtype):
    rng = np.random.default_rng(1)
    x, w, b = rand(rng, (2, 3, 13), dtype), rand(rng, (7, 13), dtype), rand(rng, (7,), dtype)
    y = dnnkit.linear(dev(x), dev(w), dev(b), activation=activation)
    assert tuple(y.shape) == (2, 3, 7)
    assert close(host(y), ref.linear_ref(x, w, b, activation), dtype)


@pytest.mark.parametrize("activation", ["identity", "gelu"])
def test_linear_returns_the_preactivation(activation):
    rng = np.random.default_rng(2)
    x, w = rand(rng, (5, 9)), rand(rng, (4, 9))
    y, z = dnnkit.linear(dev(x), dev(w), None, activation=activation, return_preactivation=True)
    assert close(host(z), ref.linear_ref(x, w), np.float32)
    assert close(host(y), ref.linear_ref(x, w, None, activation), np.float32)


@pytest.mark.parametrize("activation, saved", [(None, None), ("relu", "output"), ("tanh", "output"),
                                               ("sigmoid", "preactivation"), ("tanh", "preactivation"),
                                               ("gelu", "preactivation")])
def test_linear_backward(activation, saved):
    rng = np.random.default_rng(3)
    x, w, b = rand(rng, (2, 5, 11), np.float64), rand(rng, (6, 11), np.float64), rand(rng, (6,), np.float64)
    gy = rand(rng, (2, 5, 6), np.float64)
    z = ref.linear_ref(x, w, b)
    y = ref.activation_ref(z, activation or "identity")
    kw = {} if saved is None else {saved: dev(z if saved == "preactivation" else y)}
    gx, gw, gb = dnnkit.linear_backward(dev(gy), dev(x), dev(w), activation=activation, **kw)
    rx, rw, rb = ref.linear_backward_ref(gy, x, w, True, activation, preactivation=z)
    for got, want in ((gx, rx), (gw, rw), (gb, rb)):
        assert close(host(got), want, np.float64)


def test_linear_backward_accumulates_and_skips_the_bias():
    rng = np.random.default_rng(4)
    x, w, gy = rand(rng, (37, 9)), rand(rng, (5, 9)), rand(rng, (37, 5))
    gw0, gb0 = rand(rng, (5, 9)), rand(rng, (5,))
    into = (dev(gw0), dev(gb0))
    gx, gw, gb = dnnkit.linear_backward(dev(gy), dev(x), dev(w), accumulate_into=into)
    assert gw is into[0] and gb is into[1]
    rx, rw, rb = ref.linear_backward_ref(gy, x, w, True)
    assert close(host(gw), rw + gw0, np.float32) and close(host(gb), rb + gb0, np.float32)
    _, _, none = dnnkit.linear_backward(dev(gy), dev(x), dev(w), bias=False)
    assert none is None


@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 24), activation=st.sampled_from(ACTS),
       bias=st.booleans(), saved=st.sampled_from(["output", "preactivation"]), accumulate=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_linear_forward_and_backward_over_drawn_shapes(m, n, k, activation, bias, saved, accumulate, dtype):
    """linear (bias and activation fused, the preactivation returned) and linear_backward (from the output
    or the preactivation, into accumulate_into or new arrays) on drawn shapes."""
    rng = np.random.default_rng(m * 10000 + n * 100 + k)
    x, w, b, gy = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n,), dtype), rand(rng, (m, n), dtype)
    y, z = dnnkit.linear(dev(x), dev(w), dev(b) if bias else None, activation=activation,
                         return_preactivation=True)
    zr = ref.linear_ref(x, w, b if bias else None)
    assert close(host(z), zr, dtype) and close(host(y), ref.linear_ref(x, w, b if bias else None, activation), dtype)
    gw0, gb0 = rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
    into = (dev(gw0), dev(gb0) if bias else None) if accumulate else None
    kw = {saved: y if saved == "output" else z} if activation is not None else {}
    if saved == "output" and activation == "gelu":
        kw = {"preactivation": z}
    gx, gw, gb = dnnkit.linear_backward(dev(gy), dev(x), dev(w), bias=bias, activation=activation,
                                        accumulate_into=into, **kw)
    rx, rw, rb = ref.linear_backward_ref(gy, x, w, bias, activation, preactivation=zr)
    assert close(host(gx), rx, dtype) and close(host(gw), rw + (gw0 if accumulate else 0), dtype)
    assert (gb is None) if not bias else close(host(gb), rb + (gb0 if accumulate else 0), dtype)
    if accumulate:
        assert gw is into[0] and (gb is into[1])


def test_linear_errors_name_the_argument():
    x, w = dev(np.ones((3, 4), np.float32)), dev(np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match=r"linear: arrays on different devices \(bias on the host"):
        dnnkit.linear(x, w, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="linear: input has 5 features"):
        dnnkit.linear(dev(np.ones((3, 5), np.float32)), w)
    with pytest.raises(ValueError, match="linear: bias must have 2 elements"):
        dnnkit.linear(x, w, dev(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="linear: activation must be None or one of"):
        dnnkit.linear(x, w, activation="swish")
    with pytest.raises(ValueError, match="linear_backward: activation 'gelu' needs the forward's preactivation"):
        dnnkit.linear_backward(dev(np.ones((3, 2), np.float32)), x, w, activation="gelu",
                               output=dev(np.ones((3, 2), np.float32)))
    with pytest.raises(TypeError, match=r"linear_backward: arrays on different devices \(accumulate_into\[0\] on "
                                        r"the host"):
        dnnkit.linear_backward(dev(np.ones((3, 2), np.float32)), x, w,
                               accumulate_into=(np.zeros((2, 4), np.float32), dev(np.zeros(2, np.float32))))


def test_pack_weight_of_a_gpu_array():
    """pack_weight of a GPU array: a contiguous copy on the device that linear, linear_backward and the
    cells take where the weight went; a copy, so repack() after changing the weight in place."""
    rng = np.random.default_rng(4)
    w, x, b = rand(rng, (6, 5)), rand(rng, (3, 5)), rand(rng, (6,))
    dw = dev(np.asfortranarray(w))  # any strides
    pw = dnnkit.pack_weight(dw)
    assert isinstance(pw, dnnkit.GpuPackedWeight) and pw.shape == (6, 5) and pw.dtype == np.float32
    y = dnnkit.linear(dev(x), pw, dev(b), activation="relu")
    assert close(host(y), ref.linear_ref(x, w, b, "relu"), np.float32)
    dw.copy_to_device(np.asfortranarray(2 * w))
    assert close(host(dnnkit.linear(dev(x), pw)), ref.linear_ref(x, w, None), np.float32)  # the old copy
    pw.repack()
    assert close(host(dnnkit.linear(dev(x), pw)), ref.linear_ref(x, 2 * w, None), np.float32)
    gy = rand(rng, (3, 6))
    gx, _, _ = dnnkit.linear_backward(dev(gy), dev(x), pw)
    assert close(host(gx), gy.astype(np.float64) @ (2 * w), np.float32)
    H, I = 4, 3
    wih, whh = rand(rng, (3 * H, I), np.float64), rand(rng, (3 * H, H), np.float64)
    xc, hc = rand(rng, (2, I), np.float64), rand(rng, (2, H), np.float64)
    h1 = dnnkit.gru_cell(dev(xc), dev(hc), dnnkit.pack_weight(dev(wih)), dnnkit.pack_weight(dev(whh)))
    assert close(host(h1), ref.gru_cell_ref(xc, hc, wih, whh), np.float64)
    with pytest.raises(TypeError, match=r"linear: arrays on different devices \(input on the host"):
        dnnkit.linear(x, pw)
    with pytest.raises(ValueError, match=r"pack_weight: repack needs a weight of shape \(6, 5\)"):
        pw.repack(dev(np.ones((5, 5), np.float32)))


@pytest.mark.gpu
def test_linear_real_sizes():
    rng = np.random.default_rng(0)
    x, w, b = rand(rng, (64, 2048)), rand(rng, (1000, 2048)), rand(rng, (1000,))
    y = dnnkit.linear(dev(x), dev(w), dev(b), activation="relu")
    assert ref.rel_l2(host(y), ref.linear_ref(x, w, b, "relu")) <= 1e-5
    gy = rand(rng, (64, 1000))
    gx, gw, gb = dnnkit.linear_backward(dev(gy), dev(x), dev(w), activation="relu", output=y)
    rx, rw, rb = ref.linear_backward_ref(gy, x, w, True, "relu", preactivation=ref.linear_ref(x, w, b))
    for got, want in ((gx, rx), (gw, rw), (gb, rb)):
        assert ref.rel_l2(host(got), want) <= 1e-5
