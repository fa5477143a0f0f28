"""float32 products on AMX tiles (csrc/gemm/amx.h): each operand split into three bfloat16 parts, six part
products summed in float32. The split must be exact, the results must carry float32's error (not
bfloat16's), values the tiles cannot split must send the product to the FMA kernels, and the GEMM and
the RNN time loop must agree with float64 references as the FMA kernels do. Skipped where the CPU or OS
has no AMX-BF16."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnkit
from dnnkit.reference import (
    conv2d_backward_data_ref, conv2d_ref, gemm_ref, gru_cell_ref, linear_ref, lstm_cell_ref, rel_l2, rnn_cell_ref,
    rnn_sequence_backward_ref, rnn_sequence_ref,
)
from helpers import amx_set

pytestmark = pytest.mark.skipif(not dnnkit._cpu.amx_available(), reason="no AMX-BF16 tiles on this CPU or OS")


@pytest.fixture
def amx():
    yield from amx_set(True)


def fma_and_amx(fn):
    """fn() with the tiles off, then on."""
    previous = dnnkit.get_amx()
    try:
        dnnkit.set_amx(False)
        off = fn()
        dnnkit.set_amx(True)
        return off, fn()
    finally:
        dnnkit.set_amx(previous)


def scaled_error(c, a, b, ref):
    """max |C - ref| / (|A| |B|): each element's error against the size of its terms (float32's own
    rounding of a k-term sum is a few times 2^-24 k^0.5 of it)."""
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return float(np.max(np.abs(c - ref) / np.maximum(scale, 1e-300)))


# The smallest float32 that bfloat16's nearest rounding takes to infinity.
ROUNDS_TO_INF = float(np.array(0x7F7F8000, np.uint32).view(np.float32))


def wide_values(rng, shape):
    """Signs, 24-bit significands and exponents over the whole range the tiles split exactly."""
    return (rng.choice([-1.0, 1.0], shape) * rng.uniform(1, 2, shape) * 2.0 ** rng.integers(-99, 126, shape)).astype(
        np.float32)


def test_switch(amx):
    assert dnnkit.get_amx() and dnnkit.info()["amx"] and dnnkit.info()["amx_available"]
    dnnkit.set_amx(False)
    assert not dnnkit.get_amx()
    with pytest.raises(TypeError, match="set_amx"):
        dnnkit.set_amx(1)


def test_split_is_exact(amx):
    """A (32 x 1) times [1]: the tile sums x's three parts, x2 + x1 + x0, which must give x back, over
    the whole exponent range the tiles take."""
    rng = np.random.default_rng(0)
    x = wide_values(rng, (32, 64))
    x[0, :4] = [0.0, -0.0, np.float32(2.0 ** -100), np.nextafter(np.float32(ROUNDS_TO_INF), np.float32(0))]
    for col in range(x.shape[1]):
        a = np.ascontiguousarray(x[:, col:col + 1])
        c = np.full((32, 1), np.nan, np.float32)
        dnnkit._cpu.amx_tile_test(a, np.ones((1, 1), np.float32), c)
        np.testing.assert_array_equal(c[:, 0], a[:, 0])


def test_values_the_tiles_do_not_split_are_recognized():
    ok = np.array([[0.0, -0.0, 1.0, 2.0 ** -100, -np.nextafter(np.float32(ROUNDS_TO_INF), np.float32(0))]], np.float32)
    assert dnnkit._cpu.amx_splittable(ok)
    for bad in (np.inf, -np.inf, np.nan, 2.0 ** -101, 1e-45, ROUNDS_TO_INF, np.finfo(np.float32).max):
        x = np.ones((3, 37), np.float32)
        x[2, 36] = bad
        assert not dnnkit._cpu.amx_splittable(x), bad
        assert not dnnkit._cpu.amx_splittable(x.T), bad  # columns contiguous
        y = np.zeros((6, 74), np.float32)
        y[::2, ::2] = x
        assert not dnnkit._cpu.amx_splittable(y[::2, ::2]), bad  # neither contiguous
        assert dnnkit._cpu.amx_splittable(y[1::2, ::2])


@given(m=st.integers(1, 32), n=st.integers(1, 32), k=st.integers(1, 100), layout=st.integers(0, 7),
       alpha=st.sampled_from([1.0, -0.5]), beta=st.sampled_from([0.0, 1.0, 2.0]),
       bias=st.sampled_from([None, "cols", "rows"]), seed=st.integers(0, 2**31))
def test_tile_kernel_matches_float64(amx, m, n, k, layout, alpha, beta, bias, seed):
    """One tile of any size up to 32 x 32 on operands of every stride pattern (rows or columns contiguous,
    neither; a transposed C), alpha, beta and a bias per column or row: within float32's error."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if layout & 1:
        a = np.asfortranarray(a)
    if layout & 2:
        b = np.asfortranarray(b)
    if layout & 4:  # neither contiguous: every other element of a larger array
        a = np.repeat(np.repeat(a, 2, 0), 2, 1)[::2, ::2]
        b = np.repeat(np.repeat(b, 2, 0), 2, 1)[::2, ::2]
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    c = np.array(c0, order="C" if seed % 2 else "F")  # a copy either way
    bv = None if bias is None else rng.standard_normal(m if bias == "rows" else n).astype(np.float32)
    dnnkit._cpu.amx_tile_test(a, b, c, alpha, beta, bv, bias == "rows")
    ref = gemm_ref(a, b, c0, alpha=alpha, beta=beta)
    if bv is not None:
        ref = ref + (bv[:, None] if bias == "rows" else bv[None, :])
    scale = abs(alpha) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + abs(beta) * np.abs(c0) + (
        0 if bv is None else np.abs(bv[:, None] if bias == "rows" else bv[None, :]))
    assert np.max(np.abs(c - ref) / scale) <= 2 ** -22 * np.sqrt(k + 2)


@given(m=st.integers(192, 330), n=st.integers(192, 330), k=st.integers(192, 1100), trans_a=st.booleans(),
       trans_b=st.booleans(), beta=st.sampled_from([0.0, 1.0, 0.5]), seed=st.integers(0, 2**31))
def test_gemm_on_tiles_carries_float32_error(num_threads, m, n, k, trans_a, trans_b, beta, seed):
    """The blocked GEMM on tiles against float64: the error per element is float32's, within 2x (plus a
    rounding) of the FMA kernels' on the same operands, far from bfloat16's 2^-8."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    A, B = (a.T if trans_a else a), (b.T if trans_b else b)
    ref = gemm_ref(A, B, c0, beta=beta)
    fma, tiles = fma_and_amx(lambda: dnnkit.gemm(a, b, c0.copy(), beta=beta, trans_a=trans_a, trans_b=trans_b))
    e_fma, e_amx = scaled_error(fma, A, B, ref), scaled_error(tiles, A, B, ref)
    assert e_amx <= 2 * e_fma + 2 ** -24, (e_amx, e_fma)
    assert not np.array_equal(fma, tiles)  # the tiles did run


@pytest.mark.parametrize("n,c,k,h,w", [(8, 256, 256, 7, 7), (3, 200, 192, 9, 11), (4, 192, 320, 14, 14)])
def test_pointwise_conv_batched_on_tiles(num_threads, n, c, k, h, w):
    """1x1 convolutions whose images go side by side into one GEMM (B's columns in groups of H*W, panels
    of 32 across the groups' edges), forward and backward data, on tiles: float32's error, the tiles
    having run; an input the tiles cannot split gives the FMA kernels' bits."""
    rng = np.random.default_rng(n * c)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    dy = rng.standard_normal((n, k, h, w)).astype(np.float32)
    cases = ((lambda x_: dnnkit.conv2d(x_, wt, algo="im2col_gemm"), conv2d_ref(x, wt)),
             (lambda dy_: dnnkit.conv2d_backward_data(x.shape, wt, dy_, algo="gemm_col2im"),
              conv2d_backward_data_ref(x.shape, wt, dy)))
    for (call, ref), arg in zip(cases, (x, dy)):
        fma, tiles = fma_and_amx(lambda: call(arg))
        assert not np.array_equal(fma, tiles)  # the tiles did run
        assert rel_l2(tiles, ref) <= 2 * rel_l2(fma, ref) + 1e-7
        odd = arg.copy()
        odd[-1, -1, -1, -1] = 2.0 ** -110  # splits into no bfloat16 parts: the whole product on the FMA kernels
        fma, tiles = fma_and_amx(lambda: call(odd))
        assert np.array_equal(fma, tiles)


def test_linear_layer_with_bias_and_activation_on_tiles(num_threads):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 300)).astype(np.float32)
    w = (rng.standard_normal((500, 300)) / np.sqrt(300)).astype(np.float32)
    b = rng.standard_normal(500).astype(np.float32)
    for act in (None, "relu", "gelu"):
        fma, tiles = fma_and_amx(lambda: dnnkit.linear(x, w, b, activation=act, algo="blocked_gemm"))
        ref = linear_ref(x, w, b, act)
        assert rel_l2(tiles, ref) <= 2 * rel_l2(fma, ref) + 1e-7
        # A packed weight's panels, read in place by the tiles: the same bits as the unpacked product.
        _, packed = fma_and_amx(lambda: dnnkit.linear(x, dnnkit.pack_weight(w), b, activation=act))
        assert np.array_equal(packed, tiles)


@pytest.mark.parametrize("m,n,k", [(1000, 300, 2100), (400, 1100, 256), (3200, 256, 576)])
def test_gemm_with_each_thread_splitting_every_a_panel(num_threads, m, n, k):
    """One B block a thread: each thread splits A's panels itself, the next between the tile products of
    the one before. Rows past a panel's 32, several depth blocks (C reloaded between them), a bias and an
    activation on the last: float32's error, and a packed weight's panels give the same bits."""
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    fma, tiles = fma_and_amx(lambda: dnnkit.linear(x, w, b, activation="relu", algo="blocked_gemm"))
    ref = linear_ref(x, w, b, "relu")
    assert rel_l2(tiles, ref) <= 2 * rel_l2(fma, ref) + 1e-7
    assert not np.array_equal(fma, tiles)  # the tiles did run
    _, packed = fma_and_amx(lambda: dnnkit.linear(x, dnnkit.pack_weight(w), b, activation="relu"))
    assert np.array_equal(packed, tiles)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, 1e-35, 1e-40, ROUNDS_TO_INF])
@pytest.mark.parametrize("where", ["a", "b"])
def test_values_the_tiles_cannot_split_fall_back_to_the_fma_kernels(num_threads, bad, where):
    """Inf, NaN, subnormal and tiny values, and values bfloat16 rounds past its largest, in either operand:
    the product runs on the FMA kernels (IEEE propagation, subnormals as such), the same bits as with the
    tiles off."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 200)).astype(np.float32)
    b = rng.standard_normal((200, 256)).astype(np.float32)
    (a if where == "a" else b)[7, 9] = bad
    fma, tiles = fma_and_amx(lambda: dnnkit.gemm(a, b))
    np.testing.assert_array_equal(tiles, fma)
    if np.isinf(bad):
        assert np.isinf(tiles[7] if where == "a" else tiles[:, 9]).all()


def _sequence(mode, B, threads, algo="auto", T=5, I=24, H=40, L=1):
    """A float32 sequence's (output, h_n) on `threads` threads by algo, and the float64 reference's."""
    G = {"lstm": 4, "gru": 3, "rnn_tanh": 1}[mode]
    rng = np.random.default_rng(B + H + T)
    weights = []
    for layer in range(L):
        weights += [rng.standard_normal((G * H, I if layer == 0 else H)) / np.sqrt(H),
                    rng.standard_normal((G * H, H)) / np.sqrt(H), 0.5 * rng.standard_normal(G * H),
                    0.5 * rng.standard_normal(G * H)]
    weights = [w.astype(np.float32) for w in weights]
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    h0 = rng.standard_normal((L, B, H)).astype(np.float32)
    c0 = rng.standard_normal((L, B, H)).astype(np.float32) if mode == "lstm" else None
    previous = dnnkit.get_num_threads()
    dnnkit.set_num_threads(threads)
    try:
        if mode == "lstm":
            out, (h_n, _) = dnnkit.lstm(x, h0, c0, weights, num_layers=L, algo=algo)
        else:
            out, h_n = (dnnkit.gru if mode == "gru" else dnnkit.rnn)(x, h0, weights, num_layers=L, algo=algo)
    finally:
        dnnkit.set_num_threads(previous)
    return (out, h_n), rnn_sequence_ref(mode, x, h0, c0, weights, num_layers=L)[:2]


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
@pytest.mark.parametrize("B,threads", [(64, 2), (37, 1), (32, 1)])
def test_rnn_time_loop_on_tiles_matches_float64(mode, B, threads):
    """A sequence whose recurrent products run on the tiles (float32, batch rows filling a 32-row tile per
    thread): outputs and final states against float64 within the float32 tolerance of the FMA kernels'
    tests, and within 2x (plus a rounding) of their error on the same problem."""
    fma, tiles = fma_and_amx(lambda: _sequence(mode, B, threads, T=6, I=40, H=70, L=2))
    (out_ref, h_ref), (fma, tiles) = tiles[1], (fma[0], tiles[0])
    e_fma, e_amx = rel_l2(fma[0], out_ref), rel_l2(tiles[0], out_ref)
    assert e_amx <= 2e-5 and e_amx <= 2 * e_fma + 1e-7, (e_amx, e_fma)
    assert rel_l2(tiles[1], h_ref) <= 2e-5
    assert not np.array_equal(fma[0], tiles[0])  # the tiles did run


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_rnn_training_on_tiles_matches_float64(mode, bidirectional):
    """Training (train=True, then backward through time) where the forward's recurrent products run on the
    tiles, with no h0: outputs and every gradient against the float64 reference, as the FMA kernels'
    tests hold them."""
    T, B, I, H = 5, 48, 24, 40
    D, G = (2 if bidirectional else 1), {"lstm": 4, "gru": 3}[mode]
    rng = np.random.default_rng(3 + bidirectional)
    weights = []
    for _ in range(D):
        weights += [rng.standard_normal((G * H, I)) / np.sqrt(H), rng.standard_normal((G * H, H)) / np.sqrt(H),
                    0.5 * rng.standard_normal(G * H), 0.5 * rng.standard_normal(G * H)]
    weights = [w.astype(np.float32) for w in weights]
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    go = rng.standard_normal((T, B, D * H)).astype(np.float32)
    previous = dnnkit.get_num_threads()
    dnnkit.set_num_threads(1)  # one thread a direction: 48 rows each
    try:
        def run():
            if mode == "lstm":
                out, _, reserve = dnnkit.lstm(x, None, None, weights, bidirectional=bidirectional, train=True)
                gx, _, _, gw = dnnkit.lstm_backward(go, None, None, reserve)
            else:
                out, _, reserve = dnnkit.gru(x, None, weights, bidirectional=bidirectional, train=True)
                gx, _, gw = dnnkit.gru_backward(go, None, reserve)
            return out, gx, gw
        fma, tiles = fma_and_amx(run)
    finally:
        dnnkit.set_num_threads(previous)
    out_ref = rnn_sequence_ref(mode, x, None, None, weights, bidirectional=bidirectional)[0]
    gx_ref, _, _, gw_ref = rnn_sequence_backward_ref(mode, x, None, None, weights, go, bidirectional=bidirectional)
    assert not np.array_equal(fma[0], tiles[0])  # the tiles did run
    assert rel_l2(tiles[0], out_ref) <= 2e-5
    assert rel_l2(tiles[1], gx_ref) <= 1e-4
    for g, r in zip(tiles[2], gw_ref):
        assert rel_l2(g, r) <= 1e-4


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
@pytest.mark.parametrize("B", [24, 64, 70])
def test_cells_on_packed_weights_on_tiles_match_float64(num_threads, mode, B):
    """A cell on weights packed once (pack_weight keeps a second packing in bfloat16 parts): its products on
    the tiles, x W_ih^T and h W_hh^T summed in one tile pass, against float64, within 2x (plus a rounding)
    of the FMA kernels' error."""
    I, H = 48, 96
    G = {"lstm": 4, "gru": 3, "rnn_tanh": 1}[mode]
    rng = np.random.default_rng(B)
    w_ih = (rng.standard_normal((G * H, I)) / np.sqrt(H)).astype(np.float32)
    w_hh = (rng.standard_normal((G * H, H)) / np.sqrt(H)).astype(np.float32)
    b_ih, b_hh = (0.5 * rng.standard_normal((2, G * H))).astype(np.float32)
    x = rng.standard_normal((B, I)).astype(np.float32)
    h = rng.standard_normal((B, H)).astype(np.float32)
    c = rng.standard_normal((B, H)).astype(np.float32)

    def run():
        pih, phh = dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)  # packed with the tiles on or off
        if mode == "lstm":
            return dnnkit.lstm_cell(x, (h, c), pih, phh, b_ih, b_hh)
        if mode == "gru":
            return dnnkit.gru_cell(x, h, pih, phh, b_ih, b_hh)
        return dnnkit.rnn_tanh_cell(x, h, pih, phh, b_ih, b_hh)

    fma, tiles = fma_and_amx(run)
    if mode == "lstm":
        ref = lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
        pairs = [(tiles[0], fma[0], ref[0]), (tiles[1], fma[1], ref[1])]
    else:
        ref = (gru_cell_ref if mode == "gru" else rnn_cell_ref)(x, h, w_ih, w_hh, b_ih, b_hh)
        pairs = [(tiles, fma, ref)]
    for t, f, r in pairs:
        assert rel_l2(t, r) <= 2 * rel_l2(f, r) + 1e-7
    assert not np.array_equal(pairs[0][0], pairs[0][1])  # the tiles did run


def test_a_cell_packed_with_the_tiles_on_runs_on_the_fma_kernels_once_they_are_off():
    rng = np.random.default_rng(9)
    w_ih = rng.standard_normal((96, 32)).astype(np.float32)
    w_hh = rng.standard_normal((96, 32)).astype(np.float32)
    x, h = rng.standard_normal((2, 64, 32)).astype(np.float32)
    previous = dnnkit.get_amx()
    try:
        dnnkit.set_amx(True)
        pih, phh = dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)
        assert pih.nbytes == 96 * 32 * 4 + 3 * (96 * 32 * 2)  # float32 panels, then three bfloat16 parts
        tiles = dnnkit.gru_cell(x, h, pih, phh)
        dnnkit.set_amx(False)
        fma = dnnkit.gru_cell(x, h, pih, phh)
        assert np.array_equal(fma, dnnkit.gru_cell(x, h, dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)))
        assert not np.array_equal(fma, tiles)
    finally:
        dnnkit.set_amx(previous)


def cell_run(mode, x, h, c, w_ih, w_hh, b_ih, b_hh, train=False):
    if mode == "lstm":
        return dnnkit.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh, train=train)
    fn = {"gru": dnnkit.gru_cell, "rnn_tanh": dnnkit.rnn_tanh_cell, "rnn_relu": dnnkit.rnn_relu_cell}[mode]
    return fn(x, h, w_ih, w_hh, b_ih, b_hh, train=train)


def cell_ref(mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    if mode == "lstm":
        return lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih, b_hh)
    if mode == "gru":
        return (gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh),)
    return (rnn_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh, nonlinearity=mode[4:]),)


def cell_problem(mode, B, I, H, seed, bias=True):
    G = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}[mode]
    rng = np.random.default_rng(seed)
    w_ih = (rng.standard_normal((G * H, I)) / np.sqrt(I)).astype(np.float32)
    w_hh = (rng.standard_normal((G * H, H)) / np.sqrt(H)).astype(np.float32)
    b_ih, b_hh = (0.5 * rng.standard_normal((2, G * H))).astype(np.float32) if bias else (None, None)
    x = rng.standard_normal((B, I)).astype(np.float32)
    h = rng.standard_normal((B, H)).astype(np.float32)
    c = rng.standard_normal((B, H)).astype(np.float32)
    return x, h, c, w_ih, w_hh, b_ih, b_hh


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("B,I,H,bias", [(96, 40, 70, True), (130, 33, 65, False), (64, 600, 450, True),
                                        (64, 900, 900, True)])
def test_cells_on_weights_in_place_on_tiles_match_float64(num_threads, mode, B, I, H, bias):
    """A cell on plain weight arrays at a batch that fills the tiles: the weights split at the call as the
    tiles' A operand, x and h as B; batch rows and hidden units past whole tiles, no biases; at I = H =
    900 two copies of a gate's split rows do not fit in L2 beside x and h, and a gate runs in halves.
    Outputs against float64, within 2x (plus a rounding) of the FMA kernels' error."""
    args = cell_problem(mode, B, I, H, B + H, bias)
    fma, tiles = fma_and_amx(lambda: cell_run(mode, *args))
    fma, tiles = (fma, tiles) if mode == "lstm" else ((fma,), (tiles,))
    for t, f, r in zip(tiles, fma, cell_ref(mode, *args)):
        assert rel_l2(t, r) <= 2 * rel_l2(f, r) + 1e-7, (rel_l2(t, r), rel_l2(f, r))
    assert not np.array_equal(tiles[0], fma[0])  # the tiles did run


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_cell_training_on_tiles_matches_float64(mode):
    """train=True on the tiles: the saved gates feed the cell's backward, whose gradients match float64."""
    B, I, H = 96, 24, 40
    x, h, c, w_ih, w_hh, b_ih, b_hh = cell_problem(mode, B, I, H, 5)
    gh = np.random.default_rng(6).standard_normal((B, H)).astype(np.float32)

    def run():
        out, reserve = cell_run(mode, x, h, c, w_ih, w_hh, b_ih, b_hh, train=True)
        grads = (dnnkit.lstm_cell_backward(gh, None, reserve) if mode == "lstm"
                 else dnnkit.gru_cell_backward(gh, reserve))
        return out, grads

    fma, tiles = fma_and_amx(run)
    first = lambda out: out[0] if mode == "lstm" else out
    assert not np.array_equal(first(tiles[0]), first(fma[0]))  # the tiles did run
    for t, f in zip(tiles[1], fma[1]):
        if f is not None:
            assert rel_l2(t, f) <= 1e-5


@pytest.mark.parametrize("bad", [np.inf, np.nan, 1e-40])
@pytest.mark.parametrize("B,I,H", [(96, 40, 70), (64, 900, 900)])
@pytest.mark.parametrize("where", ["w_hh gate z", "w_ih gate r"])
def test_a_cell_weight_the_tiles_cannot_split_runs_its_block_on_the_fma_kernels(bad, B, I, H, where):
    """A value the tiles cannot split in one weight sends that block of 32 hidden units to the FMA dot
    products: the other blocks keep the tiles' results, and every unit matches float64 (inf and NaN
    where the reference has them). Gate r's W_ih rows of a block are split while the block before runs
    its last tiles; at I = H = 900 the gates run in halves."""
    x, h, c, w_ih, w_hh, b_ih, b_hh = cell_problem("gru", B, I, H, 11)
    if where == "w_hh gate z":
        w_hh[H + 40, 3] = bad  # hidden unit 40: the second block
    else:
        w_ih[40, I - 1] = bad
    fma, tiles = fma_and_amx(lambda: dnnkit.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh))
    with np.errstate(invalid="ignore", over="ignore"):
        ref = gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh)
    np.testing.assert_array_equal(np.isfinite(tiles), np.isfinite(ref))
    ok = np.isfinite(ref)
    assert np.max(np.abs(tiles[ok] - ref[ok])) <= 1e-5
    assert not np.array_equal(tiles[:, :32], fma[:, :32])  # the first block still on the tiles
    np.testing.assert_array_equal(np.isnan(tiles), np.isnan(fma))


def test_a_sequence_of_one_step_runs_each_layer_and_direction_as_a_cell_on_tiles(num_threads):
    """T = 1 with h0: every layer and direction is one cell step; two layers, both directions."""
    T, B, I, H, L = 1, 96, 30, 50, 2
    rng = np.random.default_rng(12)
    weights = []
    for layer in range(L):
        for _ in range(2):
            weights += [rng.standard_normal((4 * H, I if layer == 0 else 2 * H)) / np.sqrt(H),
                        rng.standard_normal((4 * H, H)) / np.sqrt(H), 0.5 * rng.standard_normal(4 * H),
                        0.5 * rng.standard_normal(4 * H)]
    weights = [w.astype(np.float32) for w in weights]
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    h0, c0 = rng.standard_normal((2, 2 * L, B, H)).astype(np.float32)
    fma, tiles = fma_and_amx(lambda: dnnkit.lstm(x, h0, c0, weights, num_layers=L, bidirectional=True))
    out_ref, h_ref, c_ref = rnn_sequence_ref("lstm", x, h0, c0, weights, num_layers=L, bidirectional=True)
    assert not np.array_equal(tiles[0], fma[0])
    assert rel_l2(tiles[0], out_ref) <= 2 * rel_l2(fma[0], out_ref) + 1e-7
    for t, f, r in ((tiles[1][0], fma[1][0], h_ref), (tiles[1][1], fma[1][1], c_ref)):
        assert rel_l2(t, r) <= 2 * rel_l2(f, r) + 1e-7



@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_fused_amx_runs_the_time_loop_on_tiles_below_the_rules_batch(amx, mode):
    """fused_amx: the recurrent products on the tiles at 8 batch rows, where fused's rule keeps the FMA
    kernels (its result is the FMA path's, bit for bit); float32's error against float64 either way."""
    (rule, _), (ref, _) = _sequence(mode, 8, 1, "fused")
    (tiles, _), _ = _sequence(mode, 8, 1, "fused_amx")
    (fma, _), _ = _sequence(mode, 8, 1, "fused_units")
    assert np.array_equal(rule, fma) and not np.array_equal(tiles, fma)
    assert rel_l2(tiles, ref) <= 2e-5 and rel_l2(tiles, ref) <= 2 * rel_l2(fma, ref) + 1e-7


def test_named_schedules_and_cell_paths_never_take_the_tiles(amx):
    """Every entry but fused and fused_amx is the FMA kernels' path: at a batch where fused takes the tiles,
    fused_units and fused_cell_gemm give the bits of the tiles switched off."""
    (on, _), _ = _sequence("lstm", 64, 1, "fused_units")
    dnnkit.set_amx(False)
    (off, _), _ = _sequence("lstm", 64, 1, "fused_units")
    dnnkit.set_amx(True)
    (tiles, _), _ = _sequence("lstm", 64, 1, "fused")
    assert np.array_equal(on, off) and not np.array_equal(tiles, off)
    args = cell_problem("gru", 96, 40, 70, 3)
    named = dnnkit.gru_cell(*args[:2], *args[3:], algo="fused_cell_gemm")
    dnnkit.set_amx(False)
    assert np.array_equal(named, dnnkit.gru_cell(*args[:2], *args[3:], algo="fused_cell_gemm"))
    dnnkit.set_amx(True)
    small = cell_problem("gru", 16, 40, 70, 4)
    fma = dnnkit.gru_cell(*small[:2], *small[3:], algo="fused")
    tiles = dnnkit.gru_cell(*small[:2], *small[3:], algo="fused_amx")
    assert not np.array_equal(fma, tiles)
    assert rel_l2(tiles, gru_cell_ref(*small[:2], *small[3:])) <= 2e-5
