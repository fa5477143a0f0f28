"""dnnkit GEMM and linear beside NumPy (OpenBLAS) in one process.

    python bench/gemm.py [--problems FILE] [--threads N] [--budget SECONDS] [--filter TEXT] [--isa ISA] [--markdown]

For each problem: the median time of dnnkit and of NumPy (runs interleaved, so both see the same
machine state), GFLOP/s, the ratio dnnkit/NumPy (> 1: dnnkit faster) and the fraction of the measured
float32 FMA peak. Fully-connected problems ('tb') run as dnnkit.linear(x, W) against x @ W.T.
Then one thread at 2048^3 against the measured one-core peak.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time

import numpy as np

import dnnkit
from dnnkit.problem import GemmProblem

HERE = os.path.dirname(os.path.abspath(__file__))


def read_problems(path):
    """[(GemmProblem, name)] from a descriptor file: '# comments', one descriptor and optional name a line."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = shlex.split(line)
            out.append((GemmProblem.parse(parts[0]), parts[1] if len(parts) > 1 else parts[0]))
    return out


def interleaved_medians(fns, budget, block=0.05, min_rounds=5, settle=0.15):
    """Median seconds per call of each fn. The fns take turns in blocks of about `block` seconds, the
    order alternating each round; the first call of a block is a discarded warm-up, and `settle` seconds
    of idle precede every block. Both the blocks and the idle time are there because each library's
    worker threads spin for a while after a call (OpenBLAS for about 2^28 cycles by default): alternating
    call by call, or block after block without a pause, one library's spinning threads would take the
    other's cores on a machine with few of them."""
    per_call = []
    for fn in fns:
        fn()
        t0 = time.perf_counter()
        fn()
        per_call.append(max(time.perf_counter() - t0, 1e-7))
    reps = [max(1, min(1000, int(block / t))) for t in per_call]
    times = [[] for _ in fns]
    t_end = time.perf_counter() + budget
    rounds = 0
    while rounds < min_rounds or time.perf_counter() < t_end:
        order = range(len(fns)) if rounds % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            time.sleep(settle)
            fns[i]()  # warm-up: wakes this library's threads
            for _ in range(reps[i]):
                t0 = time.perf_counter()
                fns[i]()
                times[i].append(time.perf_counter() - t0)
        rounds += 1
    return [statistics.median(ts) for ts in times]


def make_call(p: GemmProblem, rng):
    dt = np.dtype(p.dtype)
    if p.trans_b and not p.trans_a:  # a fully-connected layer: x (M x K), W (N x K)
        x = rng.standard_normal((p.m, p.k)).astype(dt)
        w = rng.standard_normal((p.n, p.k)).astype(dt)
        return (lambda: dnnkit.linear(x, w)), (lambda: x @ w.T)
    a = rng.standard_normal((p.k, p.m) if p.trans_a else (p.m, p.k)).astype(dt)
    b = rng.standard_normal((p.n, p.k) if p.trans_b else (p.k, p.n)).astype(dt)
    c = np.empty((p.m, p.n), dt)
    A = a.T if p.trans_a else a
    B = b.T if p.trans_b else b
    return (lambda: dnnkit.gemm(a, b, c, trans_a=p.trans_a, trans_b=p.trans_b)), (lambda: np.matmul(A, B, out=c))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=os.path.join(HERE, "problems", "gemm.txt"))
    ap.add_argument("--threads", type=int, default=None, help="dnnkit threads (default: all cores)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per problem")
    ap.add_argument("--filter", default="", help="only problems whose name contains this")
    ap.add_argument("--isa", choices=("ref", "avx2", "avx512"), help="use this ISA's micro-kernels (default: the best)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table for bench/RESULTS.md")
    args = ap.parse_args(argv)
    if args.threads:
        dnnkit.set_num_threads(args.threads)
    if args.isa:
        dnnkit._cpu.set_isa(args.isa)
    nt = dnnkit.get_num_threads()
    info = dnnkit.info()
    peak = dnnkit.machine.peak_gflops(nt, isa_name=info["isa_active"], seconds=0.5)
    peak1 = dnnkit.machine.peak_gflops(1, isa_name=info["isa_active"], seconds=0.5)
    print(f"# {info['cpu']} | {platform.machine()} | ISA {info['isa_active']} | "
          f"{info['ukernels']['float32']['ukernel']} | threads {nt}")
    print(f"# measured fp32 peak: {peak:.1f} GFLOP/s on {nt} threads, {peak1:.1f} on one | numpy {np.__version__}")
    rng = np.random.default_rng(0)
    rows = []
    sep = "|" if args.markdown else " "
    hdr = ["problem", "descriptor", "dnnkit GF/s", "numpy GF/s", "ratio", "% peak"]
    if args.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    else:
        print(f"{hdr[0]:<24} {hdr[1]:<24} {hdr[2]:>11} {hdr[3]:>10} {hdr[4]:>6} {hdr[5]:>7}")
    for p, name in read_problems(args.problems):
        if args.filter and args.filter not in name:
            continue
        ours, theirs = make_call(p, rng)
        t_ours, t_np = interleaved_medians([ours, theirs], args.budget)
        g_ours, g_np = p.flops / t_ours / 1e9, p.flops / t_np / 1e9
        row = (name, p.descriptor(), g_ours, g_np, t_np / t_ours, 100 * g_ours / peak)
        rows.append(row)
        if args.markdown:
            print(f"| {row[0]} | `{row[1]}` | {row[2]:.1f} | {row[3]:.1f} | {row[4]:.2f} | {row[5]:.0f}% |")
        else:
            print(f"{row[0]:<24} {row[1]:<24} {row[2]:>11.1f} {row[3]:>10.1f} {row[4]:>6.2f} {row[5]:>6.0f}%")
        sys.stdout.flush()
    # One thread at 2048^3 against the one-core peak.
    if not args.filter or args.filter in "single-thread":
        dnnkit.set_num_threads(1)
        n = 2048
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        c = np.empty((n, n), np.float32)
        (t1,) = interleaved_medians([lambda: dnnkit.gemm(a, b, c)], args.budget * 2)
        g1 = 2 * n**3 / t1 / 1e9
        print(f"# one thread, 2048^3: {g1:.1f} GFLOP/s = {100 * g1 / peak1:.0f}% of the one-core peak {peak1:.1f}")
        dnnkit.set_num_threads(nt)
    groups = {}
    for row in rows:
        groups.setdefault(row[0].split(":")[0], []).append(row[4])
    for g, ratios in groups.items():
        gm = float(np.exp(np.mean(np.log(ratios))))
        print(f"# {g}: geometric-mean ratio dnnkit/numpy {gm:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
