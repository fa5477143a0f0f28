"""Two builds of dnnkit side by side: the same calls timed in alternating processes.

    python bench/ab.py A B [--filter TEXT] [--rounds N] [--budget SECONDS] [--threads N] [--stat best]
                           [--markdown]

A and B are source trees with their extension built in place (`python setup.py build_ext --inplace`;
DNNKIT_NATIVE=1 for a build tuned to this machine). Each round starts one process per build, in turns
(the order alternating), and each process times every case: a warm-up call, then calls for `budget`
seconds, the median call kept; with `--stat best`, the calls in blocks of about 20 ms and the fastest
block's mean kept (other processes on the machine only ever add time, so on a noisy machine the fastest
block is the steadier figure of what the code costs). Reported: each build's median over the rounds,
and B's speed over A's (> 1: B is faster) with its range over the rounds. The cases cover every
operator family's hot loops: GEMM (packing and micro-kernels), linear with fused activations, each
convolution algorithm in each direction, and the RNNs forward and backward.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# name -> setup code defining call(); run with `dnnkit`, `np` and R(*shape) (float32 normal) in scope.
CASES = {
    "gemm 256^3": "a, b = R(256, 256), R(256, 256)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 512^3": "a, b = R(512, 512), R(512, 512)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 1024^3": "a, b = R(1024, 1024), R(1024, 1024)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 2048^3": "a, b = R(2048, 2048), R(2048, 2048)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 3072^3": "a, b = R(3072, 3072), R(3072, 3072)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 4096^3": "a, b = R(4096, 4096), R(4096, 4096)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 3200x1024x256": "a, b = R(3200, 256), R(256, 1024)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 784x128x1152": "a, b = R(784, 1152), R(1152, 128)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 3200x256x1024": "a, b = R(3200, 1024), R(1024, 256)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 3136x256x64": "a, b = R(3136, 64), R(64, 256)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 196x256x2304": "a, b = R(196, 2304), R(2304, 256)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 1568x512x1152": "a, b = R(1568, 1152), R(1152, 512)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 256x1024x2048 fc": "x, w = R(256, 2048), R(1024, 2048)\ndef call(): dnnkit.gemm(x, w, trans_b=True)",
    "gemm 3136x64x576": "a, b = R(3136, 576), R(576, 64)\ndef call(): dnnkit.gemm(a, b)",
    "gemm 256x256x256 ta": "a, b = R(256, 256), R(256, 256)\ndef call(): dnnkit.gemm(a, b, trans_a=True)",
    "linear b64 1024x4096": "x, w = R(64, 1024), R(4096, 1024)\ndef call(): dnnkit.linear(x, w)",
    "linear b8 1024x1024": "x, w = R(8, 1024), R(1024, 1024)\ndef call(): dnnkit.linear(x, w)",
    "linear b16 1024x1024": "x, w = R(16, 1024), R(1024, 1024)\ndef call(): dnnkit.linear(x, w)",
    "linear b1 1000x2048": "x, w = R(1, 2048), R(1000, 2048)\ndef call(): dnnkit.linear(x, w)",
    "linear b256 gelu": "x, w, b = R(256, 1024), R(1024, 1024), R(1024)\n"
                        "def call(): dnnkit.linear(x, w, b, activation='gelu')",
    "linear b256 tanh bwd": "x, w = R(256, 1024), R(1024, 1024)\ny = dnnkit.linear(x, w, activation='tanh')\n"
                            "g = R(*y.shape)\n"
                            "def call(): dnnkit.linear_backward(g, x, w, activation='tanh', output=y)",
}
# ResNet-50 layers at batch 8 (benchdnn descriptors) and the algorithms timed on each.
CONV = [
    ("mb8ic64ih56oc64oh56kh3ph1", ["im2col_gemm", "winograd_f2x2_3x3", "winograd_f4x4_3x3", "fft", "direct",
                                   "implicit_gemm"]),
    ("mb8ic256ih56oc64oh56kh1", ["im2col_gemm", "implicit_gemm", "direct"]),
    ("mb8ic3ih224oc64oh112kh7sh2ph3", ["im2col_gemm", "implicit_gemm", "direct"]),
    ("mb1ic3ih224oc64oh112kh7sh2ph3", ["im2col_gemm", "implicit_gemm"]),
    ("mb8ic512ih7oc512oh7kh3ph1", ["im2col_gemm", "winograd_f2x2_3x3", "winograd_f4x4_3x3"]),
    ("g256mb8ic256ih56oc256oh56kh3ph1", ["depthwise", "im2col_gemm"]),
    ("mb8ic512ih7oc2048oh7kh1", ["im2col_gemm", "implicit_gemm"]),
    ("mb8ic512ih28oc256oh14kh1sh2", ["im2col_gemm", "implicit_gemm"]),
    ("mb8ic1024ih14oc512oh7kh1sh2", ["im2col_gemm", "implicit_gemm"]),
    ("mb8ic1024ih14oc256oh14kh1", ["im2col_gemm", "implicit_gemm"]),
]
for desc, algos in CONV:
    for algo in algos:
        CASES[f"conv fwd {desc} {algo}"] = (f"p = ConvProblem.parse('{desc}')\n"
                                            "x, w = R(p.mb, p.ic, p.ih, p.iw), R(p.oc, p.ic // p.g, p.kh, p.kw)\n"
                                            "kw = dict(stride=(p.sh, p.sw), padding=(p.ph, p.pw), groups=p.g)\n"
                                            f"def call(): dnnkit.conv2d(x, w, algo='{algo}', **kw)")
BWD = {"bwd_data": ("conv2d_backward_data(x.shape, w, dy", ["gemm_col2im", "winograd_f4x4_3x3", "direct"]),
       "bwd_filter": ("conv2d_backward_filter(x, w.shape, dy", ["im2col_gemm", "winograd_f4x4_3x3", "direct"])}
# Backward: the first two layers with every algorithm; layers of small planes (res4's and res5's,
# several images side by side in one product) by their GEMM algorithms.
SMALL = ["mb8ic512ih7oc2048oh7kh1", "mb8ic1024ih14oc2048oh7kh1sh2", "mb8ic1024ih14oc256oh14kh1",
             "mb8ic512ih28oc256oh14kh1sh2", "mb8ic512ih7oc512oh7kh3ph1"]
for desc, algos in CONV[:2] + [(d, []) for d in SMALL]:
    for direction, (head, bwd_algos) in BWD.items():
        for algo in bwd_algos:
            if "winograd" in algo and "winograd_f4x4_3x3" not in algos or desc in SMALL and algo == "direct":
                continue
            CASES[f"conv {direction} {desc} {algo}"] = (
                f"p = ConvProblem.parse('{desc}')\n"
                "x, w = R(p.mb, p.ic, p.ih, p.iw), R(p.oc, p.ic // p.g, p.kh, p.kw)\n"
                "dy = R(p.mb, p.oc, p.oh, p.ow)\n"
                "kw = dict(stride=(p.sh, p.sw), padding=(p.ph, p.pw), groups=p.g)\n"
                f"def call(): dnnkit.{head}, algo='{algo}', **kw)")
for mode, h, b, t in (("lstm", 256, 64, 50), ("gru", 512, 16, 50), ("lstm", 1024, 1, 25)):
    g = 4 if mode == "lstm" else 3
    setup = (f"x = R({t}, {b}, {h})\nws = [0.05 * R({g * h}, {h}), 0.05 * R({g * h}, {h}), R({g * h}), R({g * h})]\n"
             f"fn, bwd = dnnkit.{mode}, dnnkit.{mode}_backward\n")
    CASES[f"{mode} H{h} B{b} T{t} fwd"] = setup + "def call(): fn(x, None, *([None] if fn is dnnkit.lstm else []), ws)"
    CASES[f"{mode} H{h} B{b} T{t} train"] = setup + (
        "args = (x, None, None, ws) if fn is dnnkit.lstm else (x, None, ws)\n"
        "def call():\n"
        "    out, _, res = fn(*args, train=True)\n"
        "    bwd(out, *((None, None) if fn is dnnkit.lstm else (None,)), res)")
for h in (256, 1024):
    CASES[f"lstm_cell packed H{h} B1 x25"] = (
        f"x, h, c = R(1, {h}), R(1, {h}), R(1, {h})\n"
        f"ws = [dnnkit.pack_weight(0.05 * R({4 * h}, {h})), dnnkit.pack_weight(0.05 * R({4 * h}, {h})), R({4 * h}), R({4 * h})]\n"
        "def call():\n    s = (h, c)\n    for _ in range(25): s = dnnkit.lstm_cell(x, s, *ws)")
    CASES[f"linear packed b1 {h}x{4 * h}"] = (
        f"x, w = R(1, {h}), dnnkit.pack_weight(R({4 * h}, {h}))\ndef call(): dnnkit.linear(x, w)")
CASES["lstm_cell H512 B64 x20"] = (
    "x, h, c = R(64, 512), R(64, 512), R(64, 512)\nws = [0.05 * R(2048, 512), 0.05 * R(2048, 512), R(2048), R(2048)]\n"
    "def call():\n    s = (h, c)\n    for _ in range(20): s = dnnkit.lstm_cell(x, s, *ws)")

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import dnnkit
from dnnkit.problem import ConvProblem
cases, budget, threads, stat = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if threads > 0:
    dnnkit.set_num_threads(threads)
rng = np.random.default_rng(0)
def R(*s): return rng.standard_normal(s, dtype=np.float32)
out = {}
for name, code in cases.items():
    env = {"dnnkit": dnnkit, "np": np, "R": R, "ConvProblem": ConvProblem}
    exec(code, env)
    call = env["call"]
    t0 = time.perf_counter()
    call()
    per_block = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-7))) if stat == "best" else 1
    ts, end = [], time.perf_counter() + budget
    while len(ts) < 3 or time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(per_block):
            call()
        ts.append((time.perf_counter() - t0) / per_block)
    out[name] = min(ts) if stat == "best" else statistics.median(ts)
print(json.dumps(out))
"""


def run_build(tree, cases, budget, threads, stat):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(tree), "python"))
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases), str(budget), str(threads), stat], env=env,
                         capture_output=True, text=True, cwd=os.path.abspath(tree))
    if res.returncode != 0:
        sys.exit(f"bench/ab.py: the build in {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of timing per case and process")
    ap.add_argument("--threads", type=int, default=0, help="dnnkit threads (0: its default)")
    ap.add_argument("--stat", choices=("median", "best"), default="median",
                    help="per process: the median call, or the fastest block of calls (about 20 ms each)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    cases = {k: v for k, v in CASES.items() if args.filter in k}
    times = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            times[side].append(run_build(getattr(args, side), cases, args.budget, args.threads, args.stat))
    hdr = "| case | A ms | B ms | A/B (B faster > 1) | range |"
    print(f"# A = {args.a}, B = {args.b}, {args.rounds} rounds, {args.stat} of each process")
    print(hdr if args.markdown else hdr.replace("|", " "))
    if args.markdown:
        print("|---|---|---|---|---|")
    logs = []
    for name in cases:
        ta = [t[name] for t in times["a"]]
        tb = [t[name] for t in times["b"]]
        ma, mb = statistics.median(ta), statistics.median(tb)
        per_round = [x / y for x, y in zip(ta, tb)]
        logs.append(ma / mb)
        row = (f"{name} | {ma * 1e3:.3f} | {mb * 1e3:.3f} | {ma / mb:.3f} | "
               f"{min(per_round):.2f}-{max(per_round):.2f}")
        print(f"| {row} |" if args.markdown else row.replace("|", " "))
    gm = statistics.geometric_mean(logs) if logs else float("nan")
    print(f"# geometric mean A/B over {len(logs)} cases: {gm:.3f}")


if __name__ == "__main__":
    main()
