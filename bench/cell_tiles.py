"""dnnkit's cells on plain weights on AMX tiles against its FMA kernels, in one process.

    python bench/cell_tiles.py [--reps N] [--rounds N] [SHAPE ...]     SHAPE: mode:H:B, e.g. lstm:1024:64

The tile path (algo="fused_amx": bfloat16 parts, csrc/gemm/amx.h) and the FMA kernels' path the rule
takes without tiles (a fused_cell_* by name) alternate round by round; each side's best round is
reported (ms a call), with their ratio and the largest difference of the outputs. The input size is H.
Without AMX tiles there is nothing to compare, and it says so.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import dnnkit
from dnnkit.algos.rnn_cpu import CELL_PATHS, shape_tuple
from dnnkit.backends.cpu import ext
from dnnkit.problem import RnnProblem

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
DEFAULT = ["lstm:256:64", "gru:256:64", "lstm:512:64", "gru:512:64", "lstm:768:64", "gru:1024:64", "lstm:1024:64",
           "lstm:512:96", "lstm:1024:128", "gru:512:128", "rnn_tanh:1024:128", "lstm:256:256", "lstm:1024:256",
           "lstm:1024:48"]


def run(mode, H, B, reps, rounds, rng):
    G, k = GATES[mode], 1 / np.sqrt(H)
    x = rng.standard_normal((B, H), dtype=np.float32)
    h = (0.5 * rng.standard_normal((B, H))).astype(np.float32)
    c = rng.standard_normal((B, H), dtype=np.float32)
    w_ih, w_hh = (rng.uniform(-k, k, (2, G * H, H))).astype(np.float32)
    b_ih, b_hh = (rng.uniform(-k, k, (2, G * H))).astype(np.float32)
    cell = getattr(dnnkit, mode + "_cell")
    state = (h, c) if mode == "lstm" else h
    code = ext.rnn_cell_path(shape_tuple(RnnProblem(mode, 1, B, H, H)), 4)
    sides = {"fma": next(n for n, c in CELL_PATHS.items() if c == code), "tiles": "fused_amx"}
    best, out = {}, {}
    for _ in range(rounds):
        for side, algo in sides.items():
            cell(x, state, w_ih, w_hh, b_ih, b_hh, algo=algo)
            t0 = time.perf_counter()
            for _ in range(reps):
                o = cell(x, state, w_ih, w_hh, b_ih, b_hh, algo=algo)
            best[side] = min(best.get(side, np.inf), (time.perf_counter() - t0) / reps)
            out[side] = o if isinstance(o, tuple) else (o,)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(out["fma"], out["tiles"]))
    return best["fma"], best["tiles"], diff


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="*", default=DEFAULT)
    ap.add_argument("--reps", type=int, default=25, help="calls a round (default 25)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds a side (default 7)")
    args = ap.parse_args(argv)
    info = dnnkit.info()
    if not info["amx"]:
        print("no AMX tiles here (dnnkit info: amx false): nothing to compare")
        return
    print(f"# {info['cpu']} | ISA {info['isa_active']} + AMX | threads {info['threads']} | float32")
    print("| cell | FMA ms | tiles ms | speedup | max diff |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        mode, H, B = shape.split(":")
        if mode not in GATES:
            raise SystemExit(f"cell_tiles: unknown cell {mode!r} (one of {', '.join(GATES)})")
        fma, tiles, diff = run(mode, int(H), int(B), args.reps, args.rounds, rng)
        print(f"| {mode} H{H} B{B} | {1e3 * fma:.3f} | {1e3 * tiles:.3f} | {fma / tiles:.2f} | {diff:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
