"""Convolution's bad input: a ValueError or TypeError whose message starts with the operator's name and
names the argument."""
from __future__ import annotations

import numpy as np
import pytest

import dnnkit

F32, F64 = np.float32, np.float64
X = np.ones((2, 4, 8, 8), F32)
W = np.ones((6, 4, 3, 3), F32)
DY = np.ones((2, 6, 6, 6), F32)  # conv2d(X, W) with the defaults: 8 - 3 + 1 = 6

BAD_INPUT = [
    # conv2d
    ("workspace_object", lambda: dnnkit.conv2d(X, W, workspace=np.zeros(10000, object)), "conv2d"),
    ("channels", lambda: dnnkit.conv2d(X, np.ones((6, 3, 3, 3), F32)), "conv2d"),
    ("groups_divide", lambda: dnnkit.conv2d(X, np.ones((6, 1, 3, 3), F32), groups=3), "conv2d"),
    ("groups_out", lambda: dnnkit.conv2d(X, np.ones((5, 2, 3, 3), F32), groups=2), "conv2d"),
    ("groups_zero", lambda: dnnkit.conv2d(X, W, groups=0), "conv2d"),
    ("groups_float", lambda: dnnkit.conv2d(X, W, groups=1.5), "conv2d"),
    ("weight_3d", lambda: dnnkit.conv2d(X, np.ones((6, 4, 3), F32)), "conv2d"),
    ("weight_5d", lambda: dnnkit.conv2d(X, np.ones((6, 4, 3, 3, 1), F32)), "conv2d"),
    ("input_2d", lambda: dnnkit.conv2d(np.ones((8, 8), F32), W), "conv2d"),
    ("input_5d", lambda: dnnkit.conv2d(np.ones((1, 2, 4, 8, 8), F32), W), "conv2d"),
    ("stride_zero", lambda: dnnkit.conv2d(X, W, stride=0), "conv2d"),
    ("stride_negative", lambda: dnnkit.conv2d(X, W, stride=(1, -1)), "conv2d"),
    ("stride_triple", lambda: dnnkit.conv2d(X, W, stride=(1, 1, 1)), "conv2d"),
    ("stride_str", lambda: dnnkit.conv2d(X, W, stride="1"), "conv2d"),
    ("dilation_zero", lambda: dnnkit.conv2d(X, W, dilation=0), "conv2d"),
    ("padding_negative", lambda: dnnkit.conv2d(X, W, padding=-1), "conv2d"),
    ("padding_pair_negative", lambda: dnnkit.conv2d(X, W, padding=(0, -2)), "conv2d"),
    ("padding_triple", lambda: dnnkit.conv2d(X, W, padding=(1, 1, 1)), "conv2d"),
    ("padding_str", lambda: dnnkit.conv2d(X, W, padding="full"), "conv2d"),
    ("padding_float", lambda: dnnkit.conv2d(X, W, padding=1.0), "conv2d"),
    ("same_strided", lambda: dnnkit.conv2d(X, W, stride=2, padding="same"), "conv2d"),
    ("kernel_too_large", lambda: dnnkit.conv2d(X, np.ones((6, 4, 9, 3), F32)), "conv2d"),
    ("dtype_mismatch", lambda: dnnkit.conv2d(X, W.astype(F64)), "conv2d"),
    ("bias_dtype", lambda: dnnkit.conv2d(X, W, np.ones(6, F64)), "conv2d"),
    ("bias_shape", lambda: dnnkit.conv2d(X, W, np.ones(5, F32)), "conv2d"),
    ("input_int", lambda: dnnkit.conv2d(X.astype(np.int32), W.astype(np.int32)), "conv2d"),
    ("input_float16", lambda: dnnkit.conv2d(X.astype(np.float16), W.astype(np.float16)), "conv2d"),
    ("input_none", lambda: dnnkit.conv2d(None, W), "conv2d"),
    ("algo_unknown", lambda: dnnkit.conv2d(X, W, algo="no_such_algorithm"), "conv2d"),
    ("algo_other_direction", lambda: dnnkit.conv2d(X, W, algo="gemm_col2im"), "conv2d"),
    ("algo_not_str", lambda: dnnkit.conv2d(X, W, algo=3), "conv2d"),
    # conv2d_backward_data
    ("bd_input_shape_3d", lambda: dnnkit.conv2d_backward_data((2, 4, 8), W, DY), "conv2d_backward_data"),
    ("bd_input_shape_str", lambda: dnnkit.conv2d_backward_data("2488", W, DY), "conv2d_backward_data"),
    ("bd_channels", lambda: dnnkit.conv2d_backward_data((2, 5, 8, 8), W, DY), "conv2d_backward_data"),
    ("bd_weight_3d", lambda: dnnkit.conv2d_backward_data(X.shape, np.ones((6, 4, 3), F32), DY), "conv2d_backward_data"),
    ("bd_dy_shape", lambda: dnnkit.conv2d_backward_data(X.shape, W, np.ones((2, 6, 7, 6), F32)),
     "conv2d_backward_data"),
    ("bd_dy_3d", lambda: dnnkit.conv2d_backward_data(X.shape, W, DY[0]), "conv2d_backward_data"),
    ("bd_dtype", lambda: dnnkit.conv2d_backward_data(X.shape, W, DY.astype(F64)), "conv2d_backward_data"),
    ("bd_stride_zero", lambda: dnnkit.conv2d_backward_data(X.shape, W, DY, stride=0), "conv2d_backward_data"),
    ("bd_padding_triple", lambda: dnnkit.conv2d_backward_data(X.shape, W, DY, padding=(0, 0, 0)),
     "conv2d_backward_data"),
    ("bd_padding_negative", lambda: dnnkit.conv2d_backward_data(X.shape, W, DY, padding=-1), "conv2d_backward_data"),
    ("bd_groups", lambda: dnnkit.conv2d_backward_data(X.shape, W, DY, groups=3), "conv2d_backward_data"),
    ("bd_algo", lambda: dnnkit.conv2d_backward_data(X.shape, W, DY, algo="no_such_algorithm"),
     "conv2d_backward_data"),
    # conv2d_backward_filter
    ("bf_weight_shape_3d", lambda: dnnkit.conv2d_backward_filter(X, (6, 4, 3), DY), "conv2d_backward_filter"),
    ("bf_channels", lambda: dnnkit.conv2d_backward_filter(X, (6, 3, 3, 3), DY), "conv2d_backward_filter"),
    ("bf_input_3d", lambda: dnnkit.conv2d_backward_filter(X[0], W.shape, DY), "conv2d_backward_filter"),
    ("bf_dy_shape", lambda: dnnkit.conv2d_backward_filter(X, W.shape, np.ones((2, 5, 6, 6), F32)),
     "conv2d_backward_filter"),
    ("bf_dtype", lambda: dnnkit.conv2d_backward_filter(X.astype(F64), W.shape, DY), "conv2d_backward_filter"),
    ("bf_dilation_zero", lambda: dnnkit.conv2d_backward_filter(X, W.shape, DY, dilation=0), "conv2d_backward_filter"),
    ("bf_padding_str", lambda: dnnkit.conv2d_backward_filter(X, W.shape, DY, padding="full"),
     "conv2d_backward_filter"),
    ("bf_algo", lambda: dnnkit.conv2d_backward_filter(X, W.shape, DY, algo="no_such_algorithm"),
     "conv2d_backward_filter"),
    # conv2d_backward_bias
    ("bb_2d", lambda: dnnkit.conv2d_backward_bias(DY[0, 0]), "conv2d_backward_bias"),
    ("bb_int", lambda: dnnkit.conv2d_backward_bias(DY.astype(np.int64)), "conv2d_backward_bias"),
    ("bb_none", lambda: dnnkit.conv2d_backward_bias(None), "conv2d_backward_bias"),
]


@pytest.mark.parametrize("call, op", [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_names_the_operator(call, op):
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    assert str(e.value).startswith(f"{op}: "), f"message does not start with '{op}: ': {e.value}"


def test_bad_input_messages_name_the_argument():
    for call, pattern in [
        (lambda: dnnkit.conv2d(X, W, stride=0), r"^conv2d: .*stride"),
        (lambda: dnnkit.conv2d(X, W, padding="full"), r"^conv2d: .*padding"),
        (lambda: dnnkit.conv2d(X, W, dilation=0), r"^conv2d: .*dilation"),
        (lambda: dnnkit.conv2d(X, np.ones((6, 1, 3, 3), F32), groups=3), r"^conv2d: .*groups"),
        (lambda: dnnkit.conv2d(X, np.ones((6, 4, 3), F32)), r"^conv2d: .*weight"),
        (lambda: dnnkit.conv2d(X, W, algo="no_such_algorithm"), r"^conv2d: .*algo.*no_such_algorithm"),
        (lambda: dnnkit.conv2d_backward_data(X.shape, W, np.ones((2, 6, 7, 6), F32)),
         r"^conv2d_backward_data: .*grad_output|^conv2d_backward_data: .*dy"),
    ]:
        with pytest.raises((ValueError, TypeError), match=pattern):
            call()


def test_sizes_beyond_64_bit_products_are_refused_up_front():
    """A padded input over 2^50 elements (or 2^62 multiply-adds) is refused by the problem, before any
    kernel sizes its buffers in 64-bit integers."""
    one = np.ones((1, 1, 1, 1), F32)
    for call in (lambda: dnnkit.conv2d(one, one, padding=2**31 - 1, stride=2**31 - 1),
                 lambda: dnnkit.conv2d(one, one, padding=2**31 - 1, stride=2**31 - 1, algo="implicit_gemm",
                                       workspace=np.zeros(1 << 20, np.uint8)),
                 lambda: dnnkit.conv2d_backward_filter(one, (1, 1, 1, 1), np.ones((1, 1, 3, 3), F32),
                                                       padding=2**30, stride=2**30)):
        with pytest.raises(ValueError, match=r"conv2d.*: .*the padded input, .* exceeds"):
            call()
    with pytest.raises(ValueError, match="exceeds"):
        dnnkit.explain("mb1ic1ih2147483647iw2147483647oc1kh3kw3ph1pw1")


@pytest.mark.parametrize("algo", ["direct", "im2col_gemm", "implicit_gemm", "fft", "auto"])
def test_a_stride_beyond_the_input_reads_one_window(algo):
    """With one output row or column, every stride reads the same window: a stride of 2^31 - 1 gives what
    stride 1 gives there, at the cost of that one window (the kernels' buffers do not scale with it)."""
    r = np.random.default_rng(0)
    x, w = r.standard_normal((1, 2, 5, 6)).astype(F32), r.standard_normal((3, 2, 3, 3)).astype(F32)
    want = dnnkit.conv2d(x, w, padding=1, algo="im2col_gemm")[:, :, :1, :1]
    got = dnnkit.conv2d(x, w, padding=1, stride=2**31 - 1, algo=algo)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    dy = r.standard_normal(got.shape).astype(F32)
    dw = dnnkit.conv2d_backward_filter(x, w.shape, dy, padding=1, stride=2**31 - 1, algo="direct")
    dw1 = dnnkit.conv2d_backward_filter(x, w.shape, dy, padding=1, stride=6, algo="im2col_gemm")
    np.testing.assert_allclose(dw, dw1, rtol=1e-5, atol=1e-5)
    dx = dnnkit.conv2d_backward_data(x.shape, w, dy, padding=1, stride=2**31 - 1, algo="direct")
    dx1 = dnnkit.conv2d_backward_data(x.shape, w, dy, padding=1, stride=6, algo="gemm_col2im")
    np.testing.assert_allclose(dx, dx1, rtol=1e-5, atol=1e-5)


def test_a_kernel_out_of_memory_is_a_memory_error_naming_the_operator():
    """The direct backward filter's per-thread buffers (sized by the padded plane) could not be allocated
    under an address-space limit: a MemoryError naming the operator, and the process lives on."""
    resource = pytest.importorskip("resource")
    import subprocess
    import sys

    code = (
        "import resource, numpy as np, dnnkit\n"
        "x = np.ones((1, 1, 3000, 3000), np.float32); dy = np.ones((1, 1, 2998, 2998), np.float32)\n"
        "dnnkit.conv2d_backward_filter(x[:, :, :10, :10].copy(), (1, 1, 3, 3), dy[:, :, :8, :8].copy(), algo='direct')\n"
        "vm = int(open('/proc/self/statm').read().split()[0]) * 4096\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (8 << 20), resource.RLIM_INFINITY))\n"
        "try:\n"
        "    dnnkit.conv2d_backward_filter(x, (1, 1, 3, 3), dy, algo='direct')\n"
        "except MemoryError as e:\n"
        "    print('MemoryError:', e)\n"
    )
    if not hasattr(resource, "RLIMIT_AS") or not __import__("os").path.exists("/proc/self/statm"):
        pytest.skip("needs Linux's address-space limit")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MemoryError: conv2d_backward_filter: direct" in done.stdout


def test_fast_transform_lengths():
    from dnnkit.algos.conv_cpu import _fast_len

    def smooth(m):
        for f in (2, 3, 5):
            while m % f == 0:
                m //= f
        return m == 1

    want = [next(m for m in range(max(1, n), 2 * n + 2) if smooth(m)) for n in range(0, 3000)]
    assert [_fast_len(n) for n in range(0, 3000)] == want
    big = _fast_len(2**40 + 1)
    assert big > 2**40 and smooth(big) and big < 2**40 * 1.01


def test_auto_gives_way_when_a_workspace_cannot_be_allocated(monkeypatch):
    """algo="auto" on a workspace allocation that fails runs the best algorithm needing less (down to none),
    with the same result; a named algorithm fails with a MemoryError naming the operator."""
    from dnnkit.ops import convolution

    r = np.random.default_rng(0)
    x, w = r.standard_normal((2, 32, 16, 16)).astype(F32), r.standard_normal((32, 32, 3, 3)).astype(F32)
    chosen = [next(c for c in dnnkit.explain("mb2ic32ih16oc32oh16kh3ph1", direction=d) if c.chosen)
              for d in ("fwd", "bwd_data", "bwd_filter")]
    if not any(c.workspace_bytes for c in chosen):
        pytest.skip("auto takes no algorithm with a workspace here")
    want = dnnkit.conv2d(x, w, padding=1, algo="direct")
    dy = r.standard_normal(want.shape).astype(F32)
    want_dx = dnnkit.conv2d_backward_data(x.shape, w, dy, padding=1, algo="direct")
    want_dw = dnnkit.conv2d_backward_filter(x, w.shape, dy, padding=1, algo="direct")
    real = convolution._cpu.workspace

    def refuse(nbytes, itemsize):
        if nbytes > 0:
            raise MemoryError("refused")
        return real(nbytes, itemsize)

    monkeypatch.setattr(convolution._cpu, "workspace", refuse)
    np.testing.assert_allclose(dnnkit.conv2d(x, w, padding=1), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dnnkit.conv2d_backward_data(x.shape, w, dy, padding=1), want_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dnnkit.conv2d_backward_filter(x, w.shape, dy, padding=1), want_dw, rtol=1e-4,
                               atol=1e-3)
    with pytest.raises(MemoryError, match="conv2d: cannot allocate a workspace of .* for im2col_gemm"):
        dnnkit.conv2d(x, w, padding=1, algo="im2col_gemm")
