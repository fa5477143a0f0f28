"""dnnkit's calls between NumPy's BLAS calls: the two thread pools, under each wait setting.

Each setting runs in its own process (OpenMP and OpenBLAS read their environment when they load):
  - NumPy's GEMV and dnnkit.linear (1024 x 1024, batch 1), each alone and called in turn;
  - what the setting costs dnnkit's calls alone, from a GEMV to a convolution.

    python bench/threads.py [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SETTINGS = [("defaults", {}), ("OMP_WAIT_POLICY=passive", {"OMP_WAIT_POLICY": "passive"}),
            ("GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}),
            ("OPENBLAS_NUM_THREADS=1", {"OPENBLAS_NUM_THREADS": "1"})]


def _median_us(f, n):
    for _ in range(10):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def child() -> dict:
    import dnnkit

    dnnkit.set_num_threads(2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1024), dtype=np.float32)
    w = rng.standard_normal((1024, 1024), dtype=np.float32)
    w2 = rng.standard_normal((1024, 1024), dtype=np.float32)
    out = {"numpy alone": _median_us(lambda: x @ w2.T, 300), "dnnkit alone": _median_us(lambda: dnnkit.linear(x, w), 300)}
    tn, td = [], []
    for _ in range(300):
        t = time.perf_counter()
        x @ w2.T
        tn.append(time.perf_counter() - t)
        t = time.perf_counter()
        dnnkit.linear(x, w)
        td.append(time.perf_counter() - t)
    out["numpy in turn"] = float(np.median(tn)) * 1e6
    out["dnnkit in turn"] = float(np.median(td)) * 1e6
    time.sleep(0.3)  # OpenBLAS's threads back asleep before dnnkit's calls are timed alone
    x16 = rng.standard_normal((16, 1024), dtype=np.float32)
    a = rng.standard_normal((256, 256), dtype=np.float32)
    a1 = rng.standard_normal((128, 128), dtype=np.float32)
    H = 512
    xc = rng.standard_normal((1, H), dtype=np.float32)
    wih = (rng.standard_normal((4 * H, H)) / np.sqrt(H)).astype(np.float32)
    b = np.zeros(4 * H, np.float32)
    xs = rng.standard_normal((50, 16, 256), dtype=np.float32)
    ws = [(rng.standard_normal((1024, 256)) / 16).astype(np.float32) for _ in range(2)]
    xi = rng.standard_normal((8, 64, 28, 28), dtype=np.float32)
    wc = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    calls = [("linear b1 1024", lambda: dnnkit.linear(x, w), 200), ("linear b16 1024", lambda: dnnkit.linear(x16, w), 200),
             ("gemm 256^3", lambda: dnnkit.gemm(a, a), 200), ("gemm 128^3", lambda: dnnkit.gemm(a1, a1), 200),
             ("lstm_cell B1 H512", lambda: dnnkit.lstm_cell(xc, (xc, xc), wih, wih, b, b), 200),
             ("lstm H256 B16 T50", lambda: dnnkit.lstm(xs, None, None, ws), 40),
             ("conv2d 8x64x28x28 3x3", lambda: dnnkit.conv2d(xi, wc, padding=1), 40)]
    for name, f, n in calls:
        out[name] = _median_us(f, n)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child()))
        return 0
    results = []
    for name, env in SETTINGS:
        base = {k: v for k, v in os.environ.items()
                if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS")}
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env={**base, **env},
                           capture_output=True, text=True, check=True)
        results.append((name, json.loads(r.stdout.strip().splitlines()[-1])))
    keys = list(results[0][1])
    sep = " | " if args.markdown else "  "
    head = ["median us"] + [name for name, _ in results]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(sep.join(f"{h:>24}" for h in head))
    for k in keys:
        row = [k] + [f"{r[k]:.0f}" for _, r in results]
        print("| " + " | ".join(row) + " |" if args.markdown else sep.join(f"{c:>24}" for c in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
