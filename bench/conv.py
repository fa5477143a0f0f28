"""dnnkit convolution beside PyTorch CPU (oneDNN) in one process, on ResNet-50's layers.

    python bench/conv.py [--problems FILE] [--batch 1,8] [--direction fwd,bwd_data,bwd_filter]
                         [--budget SECONDS] [--filter TEXT] [--markdown]

For each layer and direction: every dnnkit algorithm's median time, effective GFLOP/s (the
direct-convolution operation count), relative L2 error against a float64 result (PyTorch in float64),
PyTorch's float32 time, and the best dnnkit algorithm's ratio to PyTorch (> 1: dnnkit faster).
Layers are benchdnn descriptors; --batch replaces their minibatch.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys

import numpy as np

import dnnkit
from dnnkit.dispatch import choose
from dnnkit.problem import load_problems

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm import interleaved_medians  # noqa: E402  (same timing method as the GEMM benchmark)

HERE = os.path.dirname(os.path.abspath(__file__))
OPS = {"fwd": "conv2d_fwd", "bwd_data": "conv2d_bwd_data", "bwd_filter": "conv2d_bwd_filter"}


def torch_calls(torch, p, x, w, dy):
    import torch.nn.functional as F

    kw = dict(stride=(p.sh, p.sw), padding=(p.ph, p.pw), dilation=(p.dh + 1, p.dw + 1), groups=p.g)
    if p.direction == "fwd":
        return lambda xx=x, ww=w: F.conv2d(xx, ww, **kw)
    if p.direction == "bwd_data":
        return lambda ww=w, gg=dy: torch.nn.grad.conv2d_input(tuple(x.shape), ww, gg, **kw)
    return lambda xx=x, gg=dy: torch.nn.grad.conv2d_weight(xx, tuple(w.shape), gg, **kw)


def dnnkit_call(p, algo, x, w, dy):
    kw = dict(stride=(p.sh, p.sw), padding=(p.ph, p.pw), dilation=(p.dh + 1, p.dw + 1), groups=p.g, algo=algo)
    if p.direction == "fwd":
        return lambda: dnnkit.conv2d(x, w, **kw)
    if p.direction == "bwd_data":
        return lambda: dnnkit.conv2d_backward_data(x.shape, w, dy, **kw)
    return lambda: dnnkit.conv2d_backward_filter(x, w.shape, dy, **kw)


def rel_err(a, ref):
    return float(np.linalg.norm(a.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=os.path.join(HERE, "problems", "resnet50_conv.txt"))
    ap.add_argument("--batch", default="1,8", help="comma-separated minibatch sizes")
    ap.add_argument("--direction", default="fwd,bwd_data,bwd_filter")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of timing per layer and candidate")
    ap.add_argument("--filter", default="", help="only layers whose name contains this")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(dnnkit.get_num_threads())
    info = dnnkit.info()
    peak = dnnkit.machine.peak_gflops(seconds=0.5)
    print(f"# {info['cpu']} | {platform.machine()} | ISA {info['isa_active']} | threads {dnnkit.get_num_threads()} | "
          f"torch {torch.__version__} | fp32 peak {peak:.0f} GFLOP/s")
    rng = np.random.default_rng(0)
    layers = [q for q in load_problems(args.problems) if args.filter in q.name]
    summary = {}
    for direction in args.direction.split(","):
        for mb in (int(b) for b in args.batch.split(",")):
            ratios, auto_ratios, auto_good = [], [], 0
            print(f"\n## {direction}, batch {mb}")
            hdr = "| layer | algorithm | ms | GFLOP/s | rel. error | torch ms | best / torch |"
            print(hdr if args.markdown else hdr.replace("|", " "))
            if args.markdown:
                print("|---|---|---|---|---|---|---|")
            for base in layers:
                p = dataclasses.replace(base, mb=mb, direction=direction)
                x = rng.standard_normal((p.mb, p.ic, p.ih, p.iw)).astype(np.float32)
                w = rng.standard_normal((p.oc, p.ic // p.g, p.kh, p.kw)).astype(np.float32)
                dy = rng.standard_normal((p.mb, p.oc, p.oh, p.ow)).astype(np.float32)
                tx, tw, tdy = (torch.from_numpy(a) for a in (x, w, dy))
                ref = torch_calls(torch, p, tx.double(), tw.double(), tdy.double())().numpy()
                cands = [a for a in dnnkit.algos.algorithms(OPS[direction], "cpu") if a.supports(p) is None]
                fns = [dnnkit_call(p, a.name, x, w, dy) for a in cands] + [torch_calls(torch, p, tx, tw, tdy)]
                times = interleaved_medians(fns, args.budget * len(fns), min_rounds=2)
                t_torch = times[-1]
                best = min(times[:-1])
                for a, fn, t in zip(cands, fns, times):
                    err = rel_err(fn(), ref)
                    mark = "*" if t == best else " "
                    row = (f"{p.name} | {mark}{a.name} | {t * 1e3:.2f} | {p.flops / t / 1e9:.1f} | {err:.1e} | "
                           f"{t_torch * 1e3:.2f} | {t_torch / t:.2f}")
                    print(f"| {row} |" if args.markdown else row.replace("|", " "))
                ratios.append(t_torch / best)
                auto = choose(p).name  # what algo="auto" runs (tuning mode: dnnkit.get_tuning())
                t_auto = dict(zip((a.name for a in cands), times))[auto]
                auto_ratios.append(t_torch / t_auto)
                auto_good += t_auto <= 1.10 * best
                print(f"# auto -> {auto}: {t_auto / best:.2f}x the best time, {t_torch / t_auto:.2f}x torch")
                sys.stdout.flush()
            gm = float(np.exp(np.mean(np.log(ratios)))) if ratios else float("nan")
            gm_auto = float(np.exp(np.mean(np.log(auto_ratios)))) if auto_ratios else float("nan")
            summary[(direction, mb)] = (gm, gm_auto, auto_good, len(ratios))
            print(f"# {direction} batch {mb}: geometric mean of best/torch over {len(ratios)} layers: {gm:.2f}; "
                  f"auto/torch {gm_auto:.2f}; auto within 10% of the best on {auto_good}/{len(ratios)}")
    print()
    for (direction, mb), (gm, gm_auto, good, n) in summary.items():
        print(f"# summary {direction:<10} batch {mb}: best {gm:.2f}x PyTorch, auto ({dnnkit.get_tuning()}) "
              f"{gm_auto:.2f}x, auto within 10% of the best on {good}/{n} layers")


if __name__ == "__main__":
    main()
