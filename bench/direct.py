"""The direct convolution's kernels on ResNet-50 layers: time, share of the FMA peak, and the cost model's
prediction, in every direction.

    python bench/direct.py [--batch 8] [--reps 3]

Prints a markdown table: per layer, forward, backward data and backward filter with algo="direct" (median
of --reps calls after one warm-up), each as ms, % of the peak (the FMA rate that
`dnnkit.machine.peak_gflops` measures on all threads) and the predicted ms (`dnnkit.explain`). What
bench/RESULTS.md's table of the direct kernels' efficiency comes from, and what the constants of their
cost formulas are fitted to.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import dnnkit

# name, in channels, out channels, input size, filter size, padding, stride
LAYERS = [
    ("res2a_branch2b (3x3, 64 ch, 56x56)", 64, 64, 56, 3, 1, 1),
    ("res3a_branch2b (3x3, 128 ch, 28x28)", 128, 128, 28, 3, 1, 1),
    ("res4a_branch2b (3x3, 256 ch, 14x14)", 256, 256, 14, 3, 1, 1),
    ("res5a_branch2b (3x3, 512 ch, 7x7)", 512, 512, 7, 3, 1, 1),
    ("res2a_branch2a (1x1, 64 ch, 56x56)", 64, 64, 56, 1, 0, 1),
    ("res2b_branch2a (1x1, 256 -> 64, 56x56)", 256, 64, 56, 1, 0, 1),
    ("res4a_branch2c (1x1, 256 -> 1024, 14x14)", 256, 1024, 14, 1, 0, 1),
    ("res5a_branch2c (1x1, 512 -> 2048, 7x7)", 512, 2048, 7, 1, 0, 1),
    ("conv1 (7x7, stride 2, 3 -> 64)", 3, 64, 224, 7, 3, 2),
    ("res3a_branch1 (1x1, stride 2)", 256, 512, 56, 1, 0, 2),
]


def median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def predicted_ms(what: str, *args, **kwargs) -> str:
    lines = [ln for ln in str(dnnkit.explain(what, *args, **kwargs)).splitlines() if " direct " in ln]
    return lines[0].split("predicted")[-1].strip().removesuffix(" ms") if lines and "predicted" in lines[0] else "-"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    peak = dnnkit.machine.peak_gflops(seconds=0.5) * 1e9
    rng = np.random.default_rng(0)
    print(f"batch {args.batch}, peak {peak / 1e9:.0f} GFLOP/s; each cell: ms, % of the peak, predicted ms\n")
    print("| layer | forward | backward data | backward filter |")
    print("|---|---|---|---|")
    for name, c, k, h, r, pad, s in LAYERS:
        n = args.batch
        o = (h + 2 * pad - r) // s + 1
        x = rng.random((n, c, h, h), dtype=np.float32) - 0.5
        w = rng.random((k, c, r, r), dtype=np.float32) - 0.5
        dy = rng.random((n, k, o, o), dtype=np.float32) - 0.5
        flops = 2 * n * k * c * r * r * o * o
        kw = dict(stride=s, padding=pad)
        runs = [
            (lambda: dnnkit.conv2d(x, w, algo="direct", **kw), predicted_ms("conv2d", x, w, **kw)),
            (lambda: dnnkit.conv2d_backward_data(x.shape, w, dy, algo="direct", **kw),
             predicted_ms("conv2d_backward_data", x.shape, w, dy, **kw)),
            (lambda: dnnkit.conv2d_backward_filter(x, w.shape, dy, algo="direct", **kw),
             predicted_ms("conv2d_backward_filter", x, w.shape, dy, **kw)),
        ]
        cells = []
        for fn, pred in runs:
            t = median_s(fn, args.reps)
            cells.append(f"{t * 1e3:.1f}, {flops / t / peak:.0%}, {pred}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
