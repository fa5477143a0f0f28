"""The wavefront pipeline of multi-layer RNNs against the layer-by-layer schedule, in one process.

    python bench/rnn_wavefront.py [--threads N] [--markdown]

Both schedules compute identical results; DNNKIT_RNN_WAVEFRONT=0/1 forces one (the default picks the
wavefront for unidirectional stacks whose W_hh is 256 KiB or less a layer). Timings alternate between
the two in blocks (see bench/gemm.py's interleaved_medians).
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

GATES = {"lstm": 4, "gru": 3}
CASES = [("lstm", 64, 1, 100, 2), ("lstm", 128, 1, 100, 2), ("lstm", 128, 16, 100, 2), ("gru", 128, 16, 100, 2),
         ("lstm", 128, 16, 100, 4), ("lstm", 256, 1, 50, 2), ("lstm", 256, 16, 50, 2), ("lstm", 256, 64, 50, 2),
         ("lstm", 512, 16, 50, 2)]


def make(mode, H, B, T, L):
    G = GATES[mode]
    rng = np.random.default_rng(0)
    ws = []
    for _ in range(L):
        ws += [0.05 * rng.standard_normal((G * H, H)), 0.05 * rng.standard_normal((G * H, H)),
               np.zeros(G * H), np.zeros(G * H)]
    ws = [w.astype(np.float32) for w in ws]
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    if mode == "lstm":
        return lambda: dnnkit.lstm(x, None, None, ws, num_layers=L)
    return lambda: dnnkit.gru(x, None, ws, num_layers=L)


def forced(fn, flag):
    def run():
        os.environ["DNNKIT_RNN_WAVEFRONT"] = flag
        fn()
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1.5, help="seconds of timing per problem")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    dnnkit.set_num_threads(args.threads)
    print(f"# {dnnkit.info()['cpu']} | threads {args.threads}")
    if args.markdown:
        print("| problem | W_hh KiB | layer by layer ms | wavefront ms | speed-up | default |")
        print("|---|---|---|---|---|---|")
    for mode, H, B, T, L in CASES:
        fn = make(mode, H, B, T, L)
        a, b = interleaved_medians([forced(fn, "0"), forced(fn, "1")], args.budget)
        os.environ.pop("DNNKIT_RNN_WAVEFRONT", None)
        shape = (0 if mode == "lstm" else 1, T, B, H, H, L, 1)
        default = "wavefront" if dnnkit._cpu.rnn_uses_wavefront(shape, 4) else "layer by layer"
        name = f"{mode} H{H} B{B} T{T} L{L}"
        kib = GATES[mode] * H * H * 4 // 1024
        if args.markdown:
            print(f"| {name} | {kib} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f} | {default} |")
        else:
            print(f"{name:24s} W_hh {kib:5d} KiB  layer-by-layer {a * 1e3:8.3f} ms  wavefront {b * 1e3:8.3f} ms"
                  f"  speed-up {a / b:5.2f}  default: {default}", flush=True)


if __name__ == "__main__":
    main()
