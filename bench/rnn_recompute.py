"""Training with recompute=True (gate activations recomputed in the backward, not stored) against the
default, in one process: reserve size and the time of one training step (forward + backward).

    python bench/rnn_recompute.py [--threads N] [--budget SECONDS]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import dnnkit  # noqa: E402
from gemm import interleaved_medians  # noqa: E402

CASES = [("lstm", 512, 16, 50, 2), ("lstm", 256, 64, 50, 3), ("gru", 512, 16, 50, 2), ("lstm", 1024, 16, 25, 1)]


def make(mode, H, B, T, L, recompute):
    G = 4 if mode == "lstm" else 3
    rng = np.random.default_rng(0)
    ws = []
    for _ in range(L):
        ws += [0.05 * rng.standard_normal((G * H, H)), 0.05 * rng.standard_normal((G * H, H)), np.zeros(G * H),
               np.zeros(G * H)]
    ws = [w.astype(np.float32) for w in ws]
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    gy = np.ones((T, B, H), np.float32)
    state = {}

    def step():
        if mode == "lstm":
            _, _, r = dnnkit.lstm(x, None, None, ws, num_layers=L, train=True, recompute=recompute)
            dnnkit.lstm_backward(gy, None, None, r)
        else:
            _, _, r = dnnkit.gru(x, None, ws, num_layers=L, train=True, recompute=recompute)
            dnnkit.gru_backward(gy, None, r)
        state["reserve"] = r
    return step, state


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=2.0)
    args = ap.parse_args()
    dnnkit.set_num_threads(args.threads)
    print(f"# {dnnkit.info()['cpu']} | threads {args.threads}")
    print("| problem | reserve MiB (saved) | reserve MiB (recompute) | step ms (saved) | step ms (recompute) | time ratio |")
    print("|---|---|---|---|---|---|")
    for mode, H, B, T, L in CASES:
        (a, sa), (b, sb) = make(mode, H, B, T, L, False), make(mode, H, B, T, L, True)
        ta, tb = interleaved_medians([a, b], args.budget)
        ra, rb = sa["reserve"].reserve_bytes / 2**20, sb["reserve"].reserve_bytes / 2**20
        print(f"| {mode} H{H} B{B} T{T} L{L} | {ra:.1f} | {rb:.1f} | {ta * 1e3:.1f} | {tb * 1e3:.1f} | {tb / ta:.2f} |",
              flush=True)
    print("\nWith recompute the backward holds one layer-direction's activations at a time: the peak is the "
          "saved reserve divided by layers x directions.")


if __name__ == "__main__":
    main()
