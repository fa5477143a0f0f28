"""The persistent recurrent kernel (kernels/rnn_persistent.py, algorithm gpu_persistent): every mode, both
directions, batch_first, a grid of several blocks (one step a launch, as the simulator can run it: blocks
one at a time) and one block running every step behind its grid barrier, depth in several chunks, every
rows-a-lane and batch-tile variant; against the float64 reference. The public entry points with
algo="gpu_persistent" are in test_gpu_rnn.py."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from dnnkit import reference as ref  # noqa: E402
from dnnkit.kernels import rnn_persistent as kp  # noqa: E402
from gpu_helpers import close, dev, host, rand  # noqa: E402

CASES = [  # mode, T, B, I, H, blocks, steps a launch, batch_first, reverse, dtype
    ("lstm", 3, 3, 4, 5, 1, 3, False, False, np.float32),    # one block, every step behind the barrier
    ("lstm", 3, 3, 4, 5, 2, 1, False, True, np.float64),     # two blocks, the last one partial
    ("lstm", 2, 3, 3, 20, 1, 2, True, False, np.float32),    # 80 rows: three a lane
    ("gru", 3, 10, 3, 6, 1, 3, True, False, np.float32),     # two batch tiles, the second partial
    ("gru", 3, 2, 3, 7, 3, 1, False, True, np.float64),
    ("rnn_tanh", 2, 1, 3, 130, 2, 1, False, False, np.float32),  # depth in two chunks, 65 rows a block
    ("rnn_relu", 3, 9, 3, 40, 1, 3, False, False, np.float32),
]


def _run(mode, T, B, I, H, blocks, per_launch, batch_first, reverse, dtype, rng):
    G, dt = kp.GATES[mode], np.dtype(dtype)
    x = rand(rng, (T, B, I), dtype)
    w_ih, w_hh = rand(rng, (G * H, I), dtype) * 0.5, rand(rng, (G * H, H), dtype) * 0.5
    b_ih, b_hh = rand(rng, (G * H,), dtype), rand(rng, (G * H,), dtype)
    h0, c0 = rand(rng, (1, B, H), dtype), rand(rng, (1, B, H), dtype)
    xs = x[::-1] if reverse else x
    want = ref.rnn_sequence_ref(mode, xs, h0, c0 if mode == "lstm" else None, [w_ih, w_hh, b_ih, b_hh])
    want_y = want[0][::-1] if reverse else want[0]
    gx = (x.reshape(T * B, I).astype(np.float64) @ w_ih.T.astype(np.float64) + b_ih).astype(dtype)
    if batch_first:
        gx = np.ascontiguousarray(gx.reshape(T, B, G * H).transpose(1, 0, 2)).reshape(B * T, G * H)
    units = -(-H // blocks)
    grid, rt, bt = -(-H // units), -(-(G * units) // 32), kp.batch_tile(B)
    kern = kp.persistent_kernel(mode, dt.name, rt, bt, True)
    shared = kp.shared_elems(G * units, H, rt, bt) * dt.itemsize
    y = dev(np.full((B, T, H) if batch_first else (T, B, H), np.nan, dtype))
    save = dev(np.full((T, B, max(1, kp.SAVED[mode]) * H), np.nan, dtype))
    hseq = dev(np.full((T, kp.hseq_row(B, H, dt.itemsize)), np.nan, dtype))
    c = dev(c0[0])
    gxd, whh, bhh = dev(gx), dev(w_hh), dev(b_hh)
    h_prev = dev(h0[0])
    for t0 in range(0, T, per_launch):
        t1 = min(T, t0 + per_launch)
        counter = dev(np.zeros(1, np.uint32))
        kern[grid, kp.THREADS, 0, shared](gxd, whh, bhh, h_prev, c, y, save, hseq, counter, B, H, units, T, 0,
                                          int(reverse), int(batch_first), t0, t1)
        last = T - t1 if reverse else t1 - 1
        h_prev = dev(np.ascontiguousarray(host(y)[:, last] if batch_first else host(y)[last]))
    got = host(y)
    return (got.transpose(1, 0, 2) if batch_first else got), want_y, host(c), want, host(save)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-H{c[4]}-blocks{c[5]}-per{c[6]}" for c in CASES])
def test_kernel_matches_the_reference(case):
    mode, T, B, I, H, blocks, per_launch, batch_first, reverse, dtype = case
    rng = np.random.default_rng(hash(case[:6]) % 2**32)
    got, want_y, c, want, save = _run(*case, rng)
    assert close(got, want_y, dtype)
    if mode == "lstm":
        assert close(c, want[2][0], dtype)
        # the saved cell state of the last step processed is the final one
        last = 0 if reverse else T - 1
        assert close(save[last, :, 4 * H:5 * H], want[2][0], dtype)
    if mode in ("lstm", "gru"):
        assert np.isfinite(save).all()


def test_layout_rejects_what_it_cannot_hold():
    from dnnkit.algos.rnn_cuda import persistent_layout
    from dnnkit.problem import RnnProblem

    p = RnnProblem("lstm", 10, 8, 1024, 1024, device="cuda")
    units, blocks, rt, bt, shared = persistent_layout(p, 132, 227 * 1024)
    assert (units, blocks, rt, bt) == (8, 128, 1, 8) and shared <= 227 * 1024
    assert "shared memory" in persistent_layout(RnnProblem("lstm", 10, 8, 2048, 2048, device="cuda"), 132, 227 * 1024)
    assert "rows of W_hh" in persistent_layout(RnnProblem("lstm", 10, 8, 64, 64, device="cuda"), 1, 227 * 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("mode, H, B, T", [("lstm", 512, 8, 50), ("gru", 1024, 1, 25), ("rnn_tanh", 2048, 4, 20)])
def test_real_sizes_across_the_grid(mode, H, B, T):
    """Every SM's block, the grid barrier between every step."""
    import dnnkit

    rng = np.random.default_rng(0)
    G = kp.GATES[mode]
    ws = [rand(rng, (G * H, H)) / np.sqrt(H), rand(rng, (G * H, H)) / np.sqrt(H), rand(rng, (G * H,)),
          rand(rng, (G * H,))]
    x = rand(rng, (T, B, H))
    want = ref.rnn_sequence_ref(mode, x, None, None, ws)[0]
    fn = {"lstm": lambda *a, **k: dnnkit.lstm(a[0], None, None, a[1], **k)[0],
          "gru": lambda *a, **k: dnnkit.gru(a[0], None, a[1], **k)[0],
          "rnn_tanh": lambda *a, **k: dnnkit.rnn(a[0], None, a[1], **k)[0]}[mode]
    out = fn(dev(x), [dev(w) for w in ws], algo="gpu_persistent")
    assert ref.rel_l2(host(out), want) <= 1e-5
