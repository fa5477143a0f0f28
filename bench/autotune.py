"""The autotuner on ResNet-50: how long tuning takes, and how good the cost model's choice is.

    python bench/autotune.py [--mb 8] [--directions fwd,bwd_data,bwd_filter] [--budget S] [--markdown]

Runs in a private, empty tuning cache (nothing of the user's is read or written).
1. Tuning time: every ResNet-50 layer (forward, minibatch mb) through autotune.find with the defaults
   (budget 1 s a problem, pruning on), as `dnnkit autotune --model resnet50` does on a fresh cache.
2. Model quality: each layer and direction timed with every supporting algorithm (no pruning); then
   per layer, whether the cost model's pick is within 10% of the measured best, and the median
   |predicted - measured| / measured. Three models: as shipped (no cache) on the ceilings measured at
   the start, fitted from the cache leaving the layer itself out (what heuristic mode does on a layer
   the cache has not seen), and as shipped on the nominal ceilings (a machine never measured).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

_CACHE = tempfile.mkdtemp(prefix="dnnkit-bench-cache-")
os.environ["DNNKIT_CACHE_DIR"] = _CACHE

import dnnkit  # noqa: E402
from dnnkit.autotune import cost_model, find, measure_ceilings  # noqa: E402
from dnnkit.autotune.models import model_problems  # noqa: E402


@contextlib.contextmanager
def nominal_ceilings():
    """The cost model on its nominal ceilings (what it uses before `dnnkit autotune` measures this
    machine's), whatever the cache holds."""
    measured = cost_model.ceilings
    cost_model.ceilings = lambda: {"peak_flops": cost_model.nominal_peak_flops(),
                                   "copy_bytes_per_s": cost_model.nominal_copy_bytes_per_s(), "source": "nominal"}
    try:
        yield
    finally:
        cost_model.ceilings = measured


def within(pick, times, best):
    return pick in times and times[pick] <= 1.10 * best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--directions", default="fwd,bwd_data,bwd_filter")
    ap.add_argument("--budget", type=float, default=None, help="timing budget per problem (default: find's)")
    ap.add_argument("--skip-tuning-time", action="store_true")
    args = ap.parse_args(argv)
    info = dnnkit.info()
    print(f"dnnkit {info['version']} on {info['cpu']}, {info['isa_active']}, {info['threads']} threads; "
          f"private cache {_CACHE}")
    ceil = measure_ceilings()
    if ceil["stored"]:
        print(f"measured ceilings: {ceil['peak_flops'] / 1e9:.0f} GFLOP/s float32 FMA, "
              f"{ceil['copy_bytes_per_s'] / 1e9:.1f} GB/s copy per thread\n")
    else:
        print(f"ceilings: the peak measured {ceil['peak_flops'] / 1e9:.0f} GFLOP/s under load, not kept; the cost "
              "model runs on its nominal figures\n")

    if not args.skip_tuning_time:
        layers = model_problems("resnet50", mb=args.mb)
        t0 = time.perf_counter()
        for p in layers:
            find(p, budget=args.budget, store=False)
        total = time.perf_counter() - t0
        print(f"tuning time, ResNet-50 forward at mb {args.mb} ({len(layers)} problems, default budget and "
              f"pruning): {total:.1f} s (goal <= 120 s)\n")

    print("| direction | layer | best | measured ms | shipped model pick | fitted (leave-one-out) pick | "
          "nominal-ceilings pick | shipped error | fitted error |")
    print("| --- | --- | --- | ---: | --- | --- | --- | ---: | ---: |")
    rows = []
    for direction in args.directions.split(","):
        for p in model_problems("resnet50", mb=args.mb, direction=direction):
            if p.op == "gemm":
                continue
            res = find(p, budget=args.budget, prune=None, store=False)
            times = {r.algorithm: r.median_s for r in res if r.ok}
            raw = {name: cost_model.raw_predict(name, p) for name in times}
            with nominal_ceilings():
                nominal = {name: cost_model.raw_predict(name, p) for name in times}
            rows.append((direction, p, times, raw, nominal, res.best.algorithm))
    # Leave-one-out: the cost model's fit (cost_model.fit_corrections) from the other layers' measurements.
    samples = [[((p.op, name), t / raw[name], cost_model.features(p)) for name, t in times.items() if raw.get(name)]
               for _, p, times, raw, _, _ in rows]
    summary = {"shipped": [0, 0, []], "fitted": [0, 0, []], "nominal": [0, 0, []]}
    for i, (direction, p, times, raw, nominal, best_name) in enumerate(rows):
        fit = cost_model.fit_corrections(samples[:i] + samples[i + 1:])
        fitted = {n: raw[n] * cost_model.fitted_correction(fit, p, n) if raw[n] else raw[n] for n in raw}
        best = times[best_name]
        picks = {}
        for label, pred in (("shipped", raw), ("fitted", fitted), ("nominal", nominal)):
            known = {n: v for n, v in pred.items() if v}
            pick = min(known, key=known.get) if known else next(iter(times))
            picks[label] = pick
            s = summary[label]
            s[0] += within(pick, times, best)
            s[1] += 1
            s[2] += [abs(known[n] - times[n]) / times[n] for n in known]
        name = p.name.split(":")[-1] if p.name else p.descriptor()
        err = {k: statistics.median([abs(v - times[n]) / times[n] for n, v in pr.items() if v])
               for k, pr in (("shipped", raw), ("fitted", fitted))}
        print(f"| {direction} | {name} | {best_name} | {best * 1e3:.2f} | {picks['shipped']}"
              f"{'' if within(picks['shipped'], times, best) else ' (miss)'} | {picks['fitted']}"
              f"{'' if within(picks['fitted'], times, best) else ' (miss)'} | {picks['nominal']}"
              f"{'' if within(picks['nominal'], times, best) else ' (miss)'} | {err['shipped']:.0%} | "
              f"{err['fitted']:.0%} |")
    print()
    for label, (ok, n, errs) in summary.items():
        print(f"{label} model: pick within 10% of the best on {ok} of {n} ({ok / max(n, 1):.0%}; goal >= 80%), "
              f"median prediction error {statistics.median(errs):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
