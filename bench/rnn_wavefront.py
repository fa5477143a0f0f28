"""The time-loop schedules of multi-layer RNNs side by side, in one process: the layers one after another
with the threads sharing each step's hidden units (fused_units) or each taking its own batch rows
(fused_rows), against the wavefront pipeline (fused_wavefront, one thread a layer).

    python bench/rnn_wavefront.py [--threads N] [--markdown]

The schedules compute identical results; algo= forces one, and "rule" is what the kernel's rule (algo
"fused", dispatch's default) takes. Timings alternate between them in blocks (see bench/gemm.py's
interleaved_medians).
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
        return lambda algo: (lambda: dnnkit.lstm(x, None, None, ws, num_layers=L, algo=algo))
    return lambda algo: (lambda: dnnkit.gru(x, None, ws, num_layers=L, algo=algo))


SCHEDULES = ("fused_units", "fused_rows", "fused_wavefront")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=1.5, help="seconds of timing per problem")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    dnnkit.set_num_threads(args.threads)
    print(f"# {dnnkit.info()['cpu']} | threads {args.threads}")
    if args.markdown:
        print("| problem | W_hh KiB | units ms | rows ms | wavefront ms | fastest | rule |")
        print("|---|---|---|---|---|---|---|")
    for mode, H, B, T, L in CASES:
        fn = make(mode, H, B, T, L)
        p = dnnkit.RnnProblem(mode, T, B, H, H, layers=L)
        runnable = [a.name for a in dnnkit.algos.algorithms(p.op, "cpu") if a.name in SCHEDULES and a.supports(p) is None]
        times = dict(zip(runnable, interleaved_medians([fn(a) for a in runnable], args.budget)))
        shape = (0 if mode == "lstm" else 1, T, B, H, H, L, 1)
        rule = ("fused_wavefront" if dnnkit._cpu.rnn_uses_wavefront(shape, 4) else
                "fused_rows" if dnnkit._cpu.rnn_splits_rows(shape, 4) else "fused_units")
        fastest = min(times, key=times.get)
        name = f"{mode} H{H} B{B} T{T} L{L}"
        kib = GATES[mode] * H * H * 4 // 1024
        cells = [f"{times[a] * 1e3:.3f}" if a in times else "-" for a in SCHEDULES]
        short = lambda a: a.removeprefix("fused_")  # noqa: E731
        if args.markdown:
            print(f"| {name} | {kib} | {' | '.join(cells)} | {short(fastest)} | {short(rule)} |")
        else:
            print(f"{name:24s} W_hh {kib:5d} KiB  units/rows/wavefront ms {' / '.join(cells)}  fastest "
                  f"{short(fastest)}  rule {short(rule)}", flush=True)


if __name__ == "__main__":
    main()
