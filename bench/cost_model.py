"""The cost formulas of the GEMM paths, the RNN schedules and the cells' paths against measurement.

    python bench/cost_model.py [--budget S]

Runs in a private, empty tuning cache. Measures this machine's ceilings first (what `dnnkit autotune`
does), then times every algorithm that supports each problem (no pruning) and prints, per problem, each
algorithm's measured and predicted time (Algorithm.cost on the measured ceilings, no fitted correction),
their ratio, and whether the formulas alone would pick an algorithm within 10% of the measured best.
(The GEMMs' and the schedules' rules decide untuned dispatch; the formulas rank them in explain() and
prune what tuning times. bench/autotune.py does the same for the convolutions, whose formulas choose.)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ["DNNKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="dnnkit-bench-cache-")

import dnnkit  # noqa: E402
from dnnkit.autotune import cost_model, find, measure_ceilings  # noqa: E402
from dnnkit.problem import GemmProblem, RnnProblem  # noqa: E402

PROBLEMS = [
    GemmProblem(1, 1024, 1024, trans_b=True), GemmProblem(8, 4096, 1024, trans_b=True),
    GemmProblem(64, 1000, 2048, trans_b=True), GemmProblem(1, 1024, 1024), GemmProblem(512, 512, 512),
    GemmProblem(1024, 1024, 1024), GemmProblem(3136, 64, 576),
    RnnProblem("lstm", 50, 16, 512, 512), RnnProblem("lstm", 25, 1, 1024, 1024), RnnProblem("gru", 50, 32, 512, 512),
    RnnProblem("lstm", 50, 64, 256, 256, layers=2), RnnProblem("lstm", 20, 16, 128, 128, layers=3),
    RnnProblem("lstm", 50, 16, 512, 512, direction="bwd"), RnnProblem("gru", 25, 8, 256, 256, layers=2, dirs=2),
    RnnProblem("lstm", 1, 1, 512, 512), RnnProblem("lstm", 1, 16, 1024, 1024), RnnProblem("gru", 1, 64, 512, 512),
    GemmProblem(64, 1000, 2048, trans_b=True, packed=True),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=0.3, help="timing budget per problem (s)")
    args = ap.parse_args(argv)
    measured = measure_ceilings()
    info = dnnkit.info(gpu=False)
    print(f"dnnkit {dnnkit.__version__}, {info['cpu']}, {info['isa_active']}, {info['threads']} threads; ceilings: "
          f"{measured['peak_flops'] / 1e9:.0f} GFLOP/s, copy {(measured['copy_bytes_per_s'] or 0) / 1e9:.1f} GB/s a thread\n")
    print("| problem | algorithm | measured ms | predicted ms | predicted / measured |")
    print("| --- | --- | ---: | ---: | ---: |")
    hits, ratios = 0, []
    for p in PROBLEMS:
        res = find(p, budget=args.budget, prune=None, store=False)
        times = {r.algorithm: r.median_s for r in res if r.ok}
        pred = {n: cost_model.raw_predict(n, p) for n in times}
        best = min(times.values())
        pick = min(pred, key=pred.get)
        hits += times[pick] <= 1.10 * best
        for n in sorted(times, key=times.get):
            ratios.append(pred[n] / times[n])
            mark = " (formulas' pick)" if n == pick else ""
            print(f"| {p.descriptor()} | {n}{mark} | {times[n] * 1e3:.3f} | {pred[n] * 1e3:.3f} | "
                  f"{pred[n] / times[n]:.2f} |")
    print(f"\nformulas' pick within 10% of the measured best on {hits} of {len(PROBLEMS)}; predicted / measured: "
          f"median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
