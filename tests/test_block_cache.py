"""The recycled scratch blocks (128 KiB and up) that kernels keep between calls: results do not depend on
what a recycled block held, the budget holds, empty_cache gives the memory back, and a call repeated in a
fresh process does not fault in fresh pages each time."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import dnnkit
from dnnkit.reference import gru_cell_ref, rnn_sequence_ref

# T * B * 4H * 4 bytes = 5 MiB of input projections: a recycled block.
T, B, I, H = 10, 32, 24, 1024


def _lstm_case(seed, poison=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    if poison:
        x[:, :, 0] = np.nan  # every input projection of this call is NaN
    w = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in ((4 * H, I), (4 * H, H), (4 * H,), (4 * H,))]
    return x, w


def test_recycled_blocks_do_not_leak_into_results():
    """A call that fills its blocks with NaN, then calls that reuse them: each matches the reference."""
    dnnkit.empty_cache()
    x, w = _lstm_case(0, poison=True)
    out, _ = dnnkit.lstm(x, None, None, w)
    assert np.isnan(out).all()
    assert dnnkit.info()["block_cache_bytes"] >= 4 << 20
    for seed in (1, 2):
        x, w = _lstm_case(seed)
        out, (hn, cn), reserve = dnnkit.lstm(x, None, None, w, train=True)
        ref, ref_h, ref_c = rnn_sequence_ref("lstm", x, None, None, w)
        for got, want in ((out, ref), (hn, ref_h), (cn, ref_c)):
            assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
        grads = dnnkit.lstm_backward(np.ones_like(out), None, None, reserve)
        flat = [g for g in grads if isinstance(g, np.ndarray)] + [g for g in grads if isinstance(g, list)][0]
        assert len(flat) == 7 and all(np.isfinite(g).all() for g in flat)


def test_recycled_medium_blocks_do_not_leak_into_results():
    """The same for a GRU cell at batch 64, whose scratch blocks (128-512 KiB) are recycled too."""
    rng = np.random.default_rng(5)
    x, h = rng.standard_normal((2, 64, 256)).astype(np.float32)
    w_ih, w_hh = (rng.standard_normal((2, 768, 256)) * 0.1).astype(np.float32)
    b = rng.standard_normal(768).astype(np.float32)
    assert np.isnan(dnnkit.gru_cell(np.full_like(x, np.nan), np.full_like(h, np.nan), w_ih, w_hh, b, b)).all()
    assert dnnkit.info()["block_cache_bytes"] >= 128 << 10
    got, want = dnnkit.gru_cell(x, h, w_ih, w_hh, b, b), gru_cell_ref(x, h, w_ih, w_hh, b, b)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


def test_empty_cache_releases_everything():
    x, w = _lstm_case(3)
    dnnkit.lstm(x, None, None, w)
    held = dnnkit.info()["block_cache_bytes"]
    assert held >= 4 << 20
    assert dnnkit.empty_cache() == held
    assert dnnkit.info()["block_cache_bytes"] == 0
    assert dnnkit.empty_cache() == 0


def test_budget_from_the_environment():
    """DNNKIT_BLOCK_CACHE_MB=0 keeps nothing; a budget below the 5 MiB block keeps the smaller blocks only."""
    code = ("import numpy as np, dnnkit; x = np.ones((10, 32, 24), np.float32); "
            "w = [np.zeros((4096, 24), np.float32), np.zeros((4096, 1024), np.float32)]; "
            "dnnkit.lstm(x, None, None, w); print(dnnkit.info()['block_cache_bytes'])")
    for budget, large in (("0", False), ("3", False), ("64", True), ("-1", True), ("lots", True)):
        env = dict(os.environ, DNNKIT_BLOCK_CACHE_MB=budget)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        held = int(out.stdout.strip())
        assert (held >= 5 << 20) == large, (budget, held)
        assert held <= (int(budget) if budget.isdigit() else 256) << 20  # not a count: the default
        if budget == "0":
            assert held == 0


_CELL_SETUP = [
    "x, h = r.standard_normal((64, 256), dtype=np.float32), r.standard_normal((64, 256), dtype=np.float32)",
    "wi, wh = r.standard_normal((768, 256), dtype=np.float32), r.standard_normal((768, 256), dtype=np.float32)",
    "b = r.standard_normal(768, dtype=np.float32)",
    "def call(): dnnkit.gru_cell(x, h, wi, wh, b, b)",
]
_TRAIN_SETUP = [
    "x = r.standard_normal((25, 16, 256), dtype=np.float32)",
    "w = [r.standard_normal(s, dtype=np.float32) for s in ((1024, 256), (1024, 256), (1024,), (1024,))]",
    "g = np.ones((25, 16, 256), np.float32)",
    "def call():",
    "    out, _, res = dnnkit.lstm(x, None, None, w, train=True)",
    "    dnnkit.lstm_backward(g, None, None, res)",
]


_LINEAR_SETUP = [
    "x, w, b = (r.standard_normal(s, dtype=np.float32) for s in ((256, 1024), (1024, 1024), (1024,)))",
    "def call():",
    "    y = dnnkit.linear(x, w, b)",
    "    dnnkit.linear_backward(np.ones_like(y), x, w)",
]


@pytest.mark.parametrize("setup", [_CELL_SETUP, _TRAIN_SETUP, _LINEAR_SETUP],
                         ids=["gru_cell", "lstm_training", "linear_training"])
def test_repeated_call_takes_no_fresh_pages(setup):
    """A call repeated in a fresh process faults in no fresh pages. A GRU cell at batch 64 (scratch of
    128-512 KiB) took 120 page faults a call when glibc handed its heap's top back and grew it again; an
    LSTM training step, whose outputs NumPy allocated, 1600 once dnnkit's scratch no longer went through
    glibc (which had raised its threshold for mapping a buffer apart each time one was freed); a linear
    layer's, whose forward allocated its output in the extension, 660. Whether any of it happens depends
    on what the process allocated before."""
    code = "\n".join(["import resource, numpy as np, dnnkit", "r = np.random.default_rng(0)", *setup,
                       "for _ in range(5): call()",
                       "n0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt",
                       "for _ in range(50): call()",
                       "print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - n0) / 50)"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout.strip()) < 10


def test_fork_while_another_thread_allocates():
    """A child forked while another thread is taking and giving blocks can still allocate (the cache's
    lock is held across fork and released on both sides)."""
    import threading
    if not hasattr(os, "fork"):
        return
    x, w = _lstm_case(4)
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            dnnkit.lstm(x, None, None, w)

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(3):
            pid = os.fork()
            if pid == 0:  # the child: one call, then exit without running the parent's cleanup
                try:
                    # one thread: libgomp's thread pool does not survive a fork (not dnnkit's to fix)
                    dnnkit.set_num_threads(1)
                    out, _ = dnnkit.lstm(x, None, None, w)
                    os._exit(0 if np.isfinite(out).all() else 1)
                except BaseException:
                    os._exit(2)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        stop.set()
        t.join()
