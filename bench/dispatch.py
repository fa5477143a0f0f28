"""Dispatch overhead: a public API call on a problem seen before, against calling the algorithm it
chose directly (the same kernel on the same arrays, the output allocated the same way).

    python bench/dispatch.py [--seconds S]

The difference is what validation, the problem lookup and the remembered decision cost per call. Tiny
problems, so the kernel is short and the overhead shows. Goals: gemm at most 3.6 microseconds a call
over its kernel, conv2d at most 5.6, linear at most 3.6 (what each cost before dispatch returned plans).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import dnnkit
from dnnkit.dispatch import choose, plan
from dnnkit.problem import ConvProblem, GemmProblem, RnnProblem


# Microseconds a call over its kernel, per operator.
GOALS_US = {"linear": 3.6, "gemm": 3.6, "conv2d": 5.6}


def per_call(fn, seconds: float) -> float:
    """Median of many short batches' time per call."""
    fn()
    batch = 200
    samples = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(samples) < 5:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return statistics.median(samples)


def cases(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    p = GemmProblem(4, 32, 64, trans_b=True, bias=True)
    algo = choose(p)
    yield ("linear 4x64 -> 32, bias", lambda: dnnkit.linear(x, w, b),
           lambda: algo.run(p, x, w.T, out=np.empty((4, 32), np.float32), bias=b), algo.name)

    for size in (1, 16):
        a = rng.standard_normal((size, size)).astype(np.float32)
        q = GemmProblem(size, size, size)
        g = choose(q)
        yield (f"gemm {size}x{size}x{size}", lambda a=a: dnnkit.gemm(a, a),
               lambda a=a, q=q, g=g: g.run(q, a, a, out=np.empty(a.shape, np.float32)), g.name)

    xi = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    wi = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    c = ConvProblem.from_arrays(xi.shape, wi.shape, 1, 1, 1, 1)
    conv = choose(c)
    ws = conv.workspace_bytes(c)

    def direct():
        out = np.empty(c.output_shape, np.float32)
        work = None if ws == 0 else np.empty(ws // 4, np.float32)
        conv.run(c, xi, wi, out=out, workspace=work)

    yield ("conv2d 1x4x8x8, 3x3", lambda: dnnkit.conv2d(xi, wi, padding=1), direct, conv.name)

    # The RNNs (no goal): a sequence and a cell, the direct side the plan dispatch made, on the kernel's
    # flat weight list.
    T, B, H = 2, 2, 8
    xs = rng.standard_normal((T, B, H)).astype(np.float32)
    wl = [rng.standard_normal(s).astype(np.float32) for s in [(4 * H, H), (4 * H, H), (4 * H,), (4 * H,)]]
    for label, steps, api in (("lstm T2 B2 8 -> 8", T, lambda: dnnkit.lstm(xs, None, None, wl)),
                              ("lstm_cell B2 8 -> 8", 1, lambda: dnnkit.lstm_cell(xs[0], None, *wl))):
        rplan = plan(RnnProblem("lstm", steps, B, H, H))

        def rnn_direct(rplan=rplan, x=xs[:steps]):
            out, h_n, c_n = (np.empty(s, np.float32) for s in (x.shape, (1, B, H), (1, B, H)))
            rplan.run(x, None, None, wl, out=[out], h_n=h_n, c_n=c_n, reserve=None)

        yield label, api, rnn_direct, rplan.algorithm.name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="timing per case and side")
    args = ap.parse_args(argv)
    dnnkit.set_num_threads(1)  # tiny problems: threads would only add their own start-up cost
    print(f"dnnkit {dnnkit.__version__}, {dnnkit._cpu.cpu_model_name()}, python {sys.version.split()[0]}, "
          f"pid {os.getpid()}")
    print("| case | algorithm | API us/call | direct us/call | overhead us | goal us |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    missed = []
    for name, api, direct, algo in cases(np.random.default_rng(0)):
        # Alternate the two sides a few times and keep each side's best median: the machine is shared.
        t_api, t_direct = [], []
        for _ in range(3):
            t_api.append(per_call(api, args.seconds / 3))
            t_direct.append(per_call(direct, args.seconds / 3))
        a, d = min(t_api) * 1e6, min(t_direct) * 1e6
        goal = GOALS_US.get(name.split()[0])
        if goal is not None and a - d > goal:
            missed.append(name)
        print(f"| {name} | {algo} | {a:.2f} | {d:.2f} | {a - d:.2f} | {'-' if goal is None else f'{goal:.1f}'} |")
    print(f"\ngoals {'met' if not missed else 'NOT met: ' + ', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
