"""A smoke test of an installed dnnkit, for CI to run natively and under qemu-user as older CPUs:

    python tests/smoke.py [--expect MODULE]

gemm, linear, conv2d with every registered algorithm (forward and both backward passes), and an LSTM
forward and backward, each checked against float64 references built from NumPy's element-wise operations
only (under emulation, NumPy's BLAS may pick kernels the emulated CPU does not run). --expect names the
kernel module the CPU should get (ref, avx2 or avx512). Exits non-zero on any failure. Not collected by
pytest (the test suite covers all of this, and more, at full size).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import dnnkit


def matmul64(a, b):
    """a @ b in float64 by broadcasting and summing (no BLAS)."""
    return (a.astype(np.float64)[:, :, None] * b.astype(np.float64)[None, :, :]).sum(axis=1)


def conv_ref(x, w, pad, groups=1):
    """NCHW stride-1 convolution in float64, by shifted products."""
    if groups > 1:
        xs, ws = np.split(x, groups, axis=1), np.split(w, groups, axis=0)
        return np.concatenate([conv_ref(a, b, pad) for a, b in zip(xs, ws)], axis=1)
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    oh, ow = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    y = np.zeros((n, k, oh, ow))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i:i + oh, j:j + ow]  # n, c, oh, ow
            y += (patch[:, None] * w[None, :, :, i, j, None, None]).sum(axis=2)
    return y


def norm64(a):
    """The 2-norm in float64 by element-wise operations (np.linalg.norm calls BLAS)."""
    a = np.asarray(a, np.float64)
    return float(np.sqrt((a * a).sum()))


def rel(a, ref):
    ref = np.asarray(ref, np.float64)
    return norm64(np.asarray(a, np.float64) - ref) / max(norm64(ref), 1e-300)


def check(name, err, tol):
    status = "ok" if err <= tol else "FAILED"
    print(f"{name:<44} rel. error {err:.1e} (bound {tol:.0e}) {status}")
    return err <= tol


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect", choices=("ref", "avx2", "avx512"), help="the kernel module this CPU should get")
    args = ap.parse_args(argv)
    info = dnnkit.info()
    print(f"dnnkit {info['version']}: CPU level {info['isa_detected']}, module {info['module']}, "
          f"kernels {info['isa_active']}")
    ok = True
    if args.expect and info["module"] != f"dnnkit._cpu_{args.expect}":
        print(f"expected dnnkit._cpu_{args.expect}, got {info['module']}: FAILED")
        ok = False
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 53)).astype(np.float32)
    b = rng.standard_normal((53, 29)).astype(np.float32)
    ok &= check("gemm 37x29x53", rel(dnnkit.gemm(a, b), matmul64(a, b)), 1e-5)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal((40, 64)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    z = matmul64(x, w.T) + bias
    ok &= check("linear 5x64 -> 40, tanh", rel(dnnkit.linear(x, w, bias, activation="tanh"), np.tanh(z)), 1e-5)

    xc = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    wc = (rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32)
    y_ref = conv_ref(xc.astype(np.float64), wc.astype(np.float64), 1)
    dy = rng.standard_normal(y_ref.shape).astype(np.float32)
    for algo in dnnkit.algos.algorithms("conv2d_fwd", "cpu"):
        p = dnnkit.ConvProblem.parse("mb2ic8ih10oc8oh10kh3ph1")
        if algo.supports(p) is not None:
            continue
        ok &= check(f"conv2d {algo.name}", rel(dnnkit.conv2d(xc, wc, padding=1, algo=algo.name), y_ref),
                    10 * algo.tolerance)
    wd = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    ok &= check("conv2d depthwise", rel(dnnkit.conv2d(xc, wd, padding=1, groups=8, algo="depthwise"),
                                        conv_ref(xc.astype(np.float64), wd.astype(np.float64), 1, groups=8)), 1e-5)
    # The backward passes against the forward reference's adjoints: <dy, conv(x)> = <conv_bwd_data(dy), x>
    # = <conv_bwd_filter(x, dy), w>.
    inner = float((dy.astype(np.float64) * y_ref).sum())
    for algo in dnnkit.algos.algorithms("conv2d_bwd_data", "cpu"):
        dx = dnnkit.conv2d_backward_data(xc.shape, wc, dy, padding=1, algo=algo.name)
        ok &= check(f"conv2d_backward_data {algo.name}", abs(float((dx * xc).sum(dtype=np.float64)) - inner)
                    / abs(inner), 1e-4)
    for algo in dnnkit.algos.algorithms("conv2d_bwd_filter", "cpu"):
        dw = dnnkit.conv2d_backward_filter(xc, wc.shape, dy, padding=1, algo=algo.name)
        ok &= check(f"conv2d_backward_filter {algo.name}", abs(float((dw * wc).sum(dtype=np.float64)) - inner)
                    / abs(inner), 1e-4)

    T, B, H = 4, 3, 16
    xs = rng.standard_normal((T, B, H)).astype(np.float32)
    ws = [(0.3 * rng.standard_normal(s)).astype(np.float32) for s in ((4 * H, H), (4 * H, H), (4 * H,), (4 * H,))]
    out, (h_n, c_n), reserve = dnnkit.lstm(xs, None, None, ws, train=True)
    h = np.zeros((B, H))
    c = np.zeros((B, H))
    w64 = [v.astype(np.float64) for v in ws]
    for t in range(T):
        g = matmul64(xs[t], w64[0].T) + matmul64(h, w64[1].T) + w64[2] + w64[3]
        i, f, gg, o = (g[:, q * H:(q + 1) * H] for q in range(4))
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(gg)
        h = sig(o) * np.tanh(c)
    ok &= check("lstm forward T4 B3 H16", rel(h_n[0], h), 1e-5)
    gx, _, _, gw = dnnkit.lstm_backward(np.ones_like(out), None, None, reserve)
    # Loss sum(out): its gradient against x by a central difference along a random direction.
    d = rng.standard_normal(xs.shape).astype(np.float32)
    eps = 1e-2
    plus = dnnkit.lstm(xs + eps * d, None, None, ws)[0].astype(np.float64).sum()
    minus = dnnkit.lstm(xs - eps * d, None, None, ws)[0].astype(np.float64).sum()
    numeric = (plus - minus) / (2 * eps)
    ok &= check("lstm backward (directional derivative)", abs(float((gx * d).sum(dtype=np.float64)) - numeric)
                / abs(numeric), 1e-2)
    print("smoke test:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
