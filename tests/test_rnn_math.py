"""The RNN kernels' fast exp, sigmoid and tanh (their accuracy over the whole range, vector tails), and
calls that continue or repeat: a cell's remembered path, a sequence continued from its final state."""
from __future__ import annotations

import numpy as np
import pytest

import dnnkit
from dnnkit.reference import lstm_cell_ref, rel_l2
from helpers import DTYPES
from rnn_cases import FWD_TOL32, SeqCase, make_seq

pytestmark = pytest.mark.usefixtures("nan_rnn_outputs")


# ------------------------------------------------------------------------------ fast math, edge cases
def test_fast_math_accuracy(isa):
    """The post-GEMM's float32 exp, sigmoid and tanh (each ISA's vector code, the portable loops on ref):
    relative error <= 2e-7 (about 2 ulp) from ln of the smallest normal float (-87.3365) up; NaN passes."""
    x = np.concatenate([np.linspace(-87.3365, 88, 400001), np.linspace(-87.3365, -87, 10001), np.logspace(-30, 1, 20001), -np.logspace(-30, 1, 20001),
                        [0.0, 0.625, -0.625, np.nextafter(0.625, 0), 9.0, 20.0, -20.0]]).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = {0: np.exp(x64), 1: 1.0 / (1.0 + np.exp(-x64)), 2: np.tanh(x64)}
    for fn, e in expected.items():
        y = np.full_like(x, np.nan)
        dnnkit._cpu.rnn_math_test(fn, x, y)
        err = np.abs(y.astype(np.float64) - e) / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
        assert err.max() <= 2e-7, (fn, x[err.argmax()], err.max())
        nan = np.array([np.nan], np.float32)
        out = np.zeros(1, np.float32)
        dnnkit._cpu.rnn_math_test(fn, nan, out)
        assert np.isnan(out[0])
    assert np.array_equal(np.sign(y), np.sign(x))  # tanh keeps the sign, and tanh(0) == 0
    y64 = np.empty_like(x64)
    dnnkit._cpu.rnn_math_test(2, x64, y64)
    assert np.max(np.abs(y64 - np.tanh(x64))) <= 1e-15


def test_fast_math_large_magnitudes(isa):
    """tanh and sigmoid of large inputs: tanh is +-1 exactly past |x| = 10 and sigmoid 1 above x = 88; below
    x = -87.34, where sigmoid(x) is smaller than every normal float, sigmoid is 0 (as with flush to zero).
    No output is denormal (denormals cost the cores microcode assists)."""
    mags = np.concatenate([np.linspace(10, 200, 20001), np.logspace(2, 38, 200), [np.inf]]).astype(np.float32)
    x = np.concatenate([mags, -mags])
    tanh = np.empty_like(x)
    dnnkit._cpu.rnn_math_test(2, x, tanh)
    assert np.array_equal(tanh, np.sign(x))
    sig = np.empty_like(x)
    dnnkit._cpu.rnn_math_test(1, x, sig)
    assert np.all(sig[x >= 88] == 1.0)
    assert np.all(sig[x <= -87.34] == 0)
    for y in (tanh, sig):
        assert not np.any((y != 0) & (np.abs(y) < np.finfo(np.float32).tiny))


def test_fast_math_float64_accuracy(isa):
    """The post-GEMM's float64 exp, sigmoid and tanh (each ISA's vector code, the C library on ref), against
    80-bit references: within 4 units in the last place, from ln of the smallest normal double up (exp to
    709.7, past which it is inf), tiny arguments included; tanh is exactly +-1 past |x| = 20 and keeps
    the sign of 0; sigmoid is 1 above 37 and at most the smallest normal double below -708.4; NaN passes."""
    rng = np.random.default_rng(8)
    lo = -708.3964185322641  # ln of the smallest normal double
    x = np.concatenate([np.linspace(lo, 709.7, 200001), np.linspace(-40, 40, 100001),
                        np.logspace(-300, 1, 20001), -np.logspace(-300, 1, 20001), rng.uniform(-1, 1, 20000),
                        [0.0, -0.0, np.log(2) / 2, -np.log(2) / 2, 19.06, -19.06]])
    xl = x.astype(np.longdouble)
    refs = {0: np.exp(xl), 1: 1 / (1 + np.exp(-xl)), 2: np.tanh(xl)}
    for fn, ref in refs.items():
        y = np.full_like(x, np.nan)
        dnnkit._cpu.rnn_math_test(fn, x, y)
        ulps = np.abs(y.astype(np.longdouble) - ref) / np.spacing(np.abs(ref).astype(np.float64))
        assert ulps.max() <= 4, (fn, x[ulps.argmax()], ulps.max())
        out = np.zeros(1)
        dnnkit._cpu.rnn_math_test(fn, np.array([np.nan]), out)
        assert np.isnan(out[0])
    big = np.concatenate([np.linspace(20, 800, 10001), [1e300, np.inf]])
    special = np.concatenate([big, -big, [0.0, -0.0]])
    for fn in (1, 2):
        y = np.empty_like(special)
        dnnkit._cpu.rnn_math_test(fn, special, y)
        if fn == 2:
            assert np.array_equal(y, np.sign(special)) and np.array_equal(np.signbit(y), np.signbit(special))
        else:
            assert np.all(y[special >= 37] == 1.0) and np.all(y[special <= -708.4] <= np.finfo(np.float64).tiny)
    y = np.empty(4)
    dnnkit._cpu.rnn_math_test(0, np.array([710.0, np.inf, -746.0, -np.inf]), y)
    assert np.array_equal(y, [np.inf, np.inf, 0.0, 0.0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_math_vector_tails(isa, dtype):
    """Arrays of every length up to three vectors: the masked tail gives what a full vector gives, reads
    and writes nothing past the end, and NaN or inf in any lane stays in that lane."""
    rng = np.random.default_rng(5)
    base = rng.uniform(-12, 12, 48).astype(dtype)
    for fn in range(3):
        full = np.empty_like(base)
        dnnkit._cpu.rnn_math_test(fn, base, full)
        for n in range(1, 49):
            out = np.full(n + 3, -7.0, dtype)
            dnnkit._cpu.rnn_math_test(fn, base[:n], out[:n])
            assert np.array_equal(out[:n], full[:n]), (fn, n)
            assert np.all(out[n:] == -7.0), (fn, n)
        special = base[:19].copy()
        special[[3, 17]] = np.nan
        special[5], special[18] = np.inf, -np.inf
        out = np.empty_like(special)
        dnnkit._cpu.rnn_math_test(fn, special, out)
        assert np.isnan(out[[3, 17]]).all()
        # exp saturates at its range's ends (0 and inf with AVX-512; the smallest normal float and exp(88)
        # elsewhere)
        assert out[5] == 1.0 if fn else out[5] > 1e38
        assert out[18] == -1.0 if fn == 2 else 0 <= out[18] < 1e-37
        keep = np.isfinite(special)
        assert np.array_equal(out[keep], full[:19][keep])


def test_repeated_cell_calls_take_the_remembered_path():
    """A cell stepped in a loop reuses its first call's checks and dispatch: every step still matches the
    reference, a transposed (non-contiguous) weight or a wrong shape in the same loop is handled as on a
    first call, and the remembered decisions stay keyed by signature."""
    from dnnkit.ops import _common
    rng = np.random.default_rng(11)
    H, I, B = 6, 4, 3
    w_ih, w_hh = rng.standard_normal((4 * H, I)).astype(np.float32), rng.standard_normal((4 * H, H)).astype(np.float32)
    b_ih, b_hh = rng.standard_normal(4 * H).astype(np.float32), rng.standard_normal(4 * H).astype(np.float32)
    h, c = np.zeros((B, H), np.float32), np.zeros((B, H), np.float32)
    _common._calls.clear()
    for step in range(4):
        x = rng.standard_normal((B, I)).astype(np.float32)
        eh, ec = lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
        h, c = dnnkit.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
        assert rel_l2(h, eh) <= FWD_TOL32 and rel_l2(c, ec) <= FWD_TOL32
    assert [k[0] for k in _common._calls] == ["lstm_cell"]
    w_t = np.asfortranarray(w_ih)  # same shape and dtype, not C-contiguous
    eh, ec = lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
    got = dnnkit.lstm_cell(x, (h, c), w_t, w_hh, b_ih, b_hh)
    assert rel_l2(got[0], eh) <= FWD_TOL32
    with pytest.raises(ValueError, match="lstm_cell: hx\\[0\\] must have shape"):
        dnnkit.lstm_cell(x, (h[:, :-1].copy(), c), w_ih, w_hh, b_ih, b_hh)
    with pytest.raises(TypeError, match="lstm_cell: train must be a bool"):
        dnnkit.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh, train=1)


def test_sequence_state_is_continued():
    """Running a sequence in two halves, the second from the first's (h_n, c_n), equals running it whole."""
    c = SeqCase("lstm", 6, 2, 3, 5, 2, False, True, False, False, True, False, np.float64, 2, seed=3)
    x, h0, c0, w = make_seq(c)
    out, (hn, cn) = dnnkit.lstm(x, h0, c0, w, num_layers=2)
    o1, (h1, c1) = dnnkit.lstm(x[:3], h0, c0, w, num_layers=2)
    o2, (h2, c2) = dnnkit.lstm(x[3:], h1, c1, w, num_layers=2)
    assert rel_l2(np.concatenate([o1, o2]), out) <= 1e-14
    assert rel_l2(h2, hn) <= 1e-14 and rel_l2(c2, cn) <= 1e-14
