"""dnnkit's fused RNNs beside PyTorch CPU (oneDNN/MKL) in one process.

    python bench/rnn.py [--quick | --long] [--threads N] [--budget SECONDS] [--filter TEXT] [--markdown] [--passes N]

Sequences (torch.nn.LSTM / GRU, input size = hidden size; LSTMs with projections, "P<n>", take inputs of
the projection's size): inference (torch under no_grad) and a training step (forward, then backward of
every input, state and weight for a random grad_output);
then the cells (torch.nn.LSTMCell / GRUCell) stepped over T time steps in a Python loop, on plain weights
and on weights packed once before the loop (dnnkit.pack_weight; torch's cells have no such form), and a
cell's training step: T steps forward, then backward through time step by step in reverse (dnnkit's
weight gradients summed over the steps with accumulate_into; torch's by autograd). For each
problem: both medians (runs interleaved in blocks, see bench/gemm.py), the ratio torch/dnnkit (> 1:
dnnkit faster) and dnnkit's GFLOP/s counting the GEMMs only (forward 2*T*B*G*H*(I + H) per layer and
direction, 2*T*B*(G*H*(I + P) + P*H) with a projection; a training step 3x that). The cells at batch 1,
bound by reading their weights, are also shown against this machine's read bandwidth.

On a shared machine one problem's ratio can move by 10-25% between runs (the neighbours' load changes
within minutes). --passes N times the whole list N times over, so that each problem is measured in N
windows minutes apart, and reports the medians over the passes and the range of the ratio.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import dnnkit  # noqa: E402
from gemm import interleaved_medians  # noqa: E402

GATES = {"lstm": 4, "gru": 3}

# (mode, H, B, T, layers[, projection size])
PROJ = [("lstm", 1024, b, 50, l, 256) for (b, l) in ((1, 1), (16, 1), (64, 1), (16, 2))]  # LSTMP, speech-style
FULL = [(m, h, b, 50, 1) for m in ("lstm", "gru") for h in (256, 512, 1024) for b in (1, 16, 64)] + [
    (m, 512, b, t, l) for m in ("lstm", "gru") for (b, t, l) in ((16, 25, 1), (16, 100, 1), (16, 50, 2), (64, 50, 2))
] + [(m, 128, b, 100, 2) for m in ("lstm", "gru") for b in (1, 16)] + PROJ  # the wavefront pipeline; LSTMP
QUICK = [(m, h, b, 25, 1) for m in ("lstm", "gru") for h in (256, 512) for b in (1, 64)] + [
    ("lstm", 512, 16, 25, 2), ("lstm", 128, 16, 50, 2), ("lstm", 1024, 16, 25, 1, 256)]
# Sequence length at a fixed shape: the share of a step that streams the recurrent weights grows with T.
LONG = [(m, 512, 16, t, 1) for m in ("lstm", "gru") for t in (10, 50, 200)]
CELLS_FULL = [(m, h, b) for m in ("lstm", "gru") for h in (256, 512, 1024) for b in (1, 16, 64)]
CELLS_QUICK = [(m, h, b) for m in ("lstm", "gru") for h in (256, 1024) for b in (1, 64)]
CELL_STEPS = 25
# Seconds per timing block: longer than gemm.py's, since one call here takes up to a second and the
# first calls after each idle `settle` run slower on a shared virtual machine.
BLOCK = 0.25


def flops(mode, H, B, T, L, I=None, P=0):
    S = P or H  # the size of h
    I = S if I is None else I
    total = 0
    for layer in range(L):
        total += 2 * T * B * (GATES[mode] * H * ((I if layer == 0 else S) + S) + P * H)
    return total


def sequence_calls(torch, mode, H, B, T, L, train, rng, P=0):
    S = P or H  # inputs, h and the output are S wide
    if mode == "lstm":
        module = torch.nn.LSTM(S, H, num_layers=L, proj_size=P)
    else:
        module = torch.nn.GRU(H, H, num_layers=L)
    weights = [p.detach().numpy().copy() for p in module.parameters()]
    x = rng.standard_normal((T, B, S)).astype(np.float32)
    h0 = rng.standard_normal((L, B, S)).astype(np.float32)
    go = rng.standard_normal((T, B, S)).astype(np.float32)
    tx, th0, tgo = torch.from_numpy(x), torch.from_numpy(h0), torch.from_numpy(go)
    c0 = rng.standard_normal((L, B, H)).astype(np.float32) if mode == "lstm" else None
    tstate = (th0, torch.from_numpy(c0)) if mode == "lstm" else th0

    if not train:
        def ours():
            return dnnkit.lstm(x, h0, c0, weights, num_layers=L, proj_size=P) if mode == "lstm" else \
                dnnkit.gru(x, h0, weights, num_layers=L)

        def theirs():
            with torch.no_grad():
                return module(tx, tstate)
        return ours, theirs

    txg = tx.clone().requires_grad_(True)

    def ours():
        if mode == "lstm":
            out, _, res = dnnkit.lstm(x, h0, c0, weights, num_layers=L, train=True, proj_size=P)
            return dnnkit.lstm_backward(go, None, None, res)
        out, _, res = dnnkit.gru(x, h0, weights, num_layers=L, train=True)
        return dnnkit.gru_backward(go, None, res)

    def theirs():
        for p in module.parameters():
            p.grad = None
        txg.grad = None
        out, _ = module(txg, tstate)
        out.backward(tgo)
    return ours, theirs


def cell_calls(torch, mode, H, B, rng, packed=False):
    module = (torch.nn.LSTMCell if mode == "lstm" else torch.nn.GRUCell)(H, H)
    w_ih, w_hh, b_ih, b_hh = [p.detach().numpy().copy() for p in module.parameters()]
    if packed:  # once, outside the timed loop, as a model packs its weights when it is loaded
        w_ih, w_hh = dnnkit.pack_weight(w_ih), dnnkit.pack_weight(w_hh)
    xs = rng.standard_normal((CELL_STEPS, B, H)).astype(np.float32)
    h = rng.standard_normal((B, H)).astype(np.float32)
    txs, th = torch.from_numpy(xs), torch.from_numpy(h)

    if mode == "lstm":
        def ours():
            hx = (h, h)
            for t in range(CELL_STEPS):
                hx = dnnkit.lstm_cell(xs[t], hx, w_ih, w_hh, b_ih, b_hh)
            return hx

        def theirs():
            with torch.no_grad():
                hx = (th, th)
                for t in range(CELL_STEPS):
                    hx = module(txs[t], hx)
            return hx
    else:
        def ours():
            hx = h
            for t in range(CELL_STEPS):
                hx = dnnkit.gru_cell(xs[t], hx, w_ih, w_hh, b_ih, b_hh)
            return hx

        def theirs():
            with torch.no_grad():
                hx = th
                for t in range(CELL_STEPS):
                    hx = module(txs[t], hx)
            return hx
    return ours, theirs


def cell_training_calls(torch, mode, H, B, rng):
    """T cell steps forward, then the gradients of sum_t <g_t, h_t> with respect to every input, the
    initial state and every weight, backward through time by hand (dnnkit) or by autograd (torch)."""
    module = (torch.nn.LSTMCell if mode == "lstm" else torch.nn.GRUCell)(H, H)
    w = [p.detach().numpy().copy() for p in module.parameters()]
    xs = rng.standard_normal((CELL_STEPS, B, H)).astype(np.float32)
    gs = rng.standard_normal((CELL_STEPS, B, H)).astype(np.float32)
    h = rng.standard_normal((B, H)).astype(np.float32)
    txs, th, tgs = torch.from_numpy(xs).requires_grad_(), torch.from_numpy(h).requires_grad_(), torch.from_numpy(gs)
    lstm = mode == "lstm"
    cell = dnnkit.lstm_cell if lstm else dnnkit.gru_cell

    def ours():
        hx, saved = ((h, h) if lstm else h), []
        for t in range(CELL_STEPS):
            hx, res = cell(xs[t], hx, *w, train=True)
            saved.append(res)
        dh, dc, into = 0.0, None, None
        for t in reversed(range(CELL_STEPS)):
            # the last step's call makes the gradient arrays; the earlier steps' add into them
            g = (dnnkit.lstm_cell_backward(gs[t] + dh, dc, saved[t], accumulate_into=into) if lstm
                 else dnnkit.gru_cell_backward(gs[t] + dh, saved[t], accumulate_into=into))
            dh, dc, into = g[1], (g[2] if lstm else None), g[-4:]
        return into

    def theirs():
        module.zero_grad(set_to_none=True)
        txs.grad = th.grad = None
        hx, outs = ((th, th) if lstm else th), []
        for t in range(CELL_STEPS):
            hx = module(txs[t], hx)
            outs.append(hx[0] if lstm else hx)
        torch.autograd.backward(outs, list(tgs))
    return ours, theirs


def bandwidth_table(plan, timings, args):
    """Cells at batch 1 read all of both weights every step and do 2 FLOPs a weight: a memory-bound
    product. For each, the weights' GB/s both libraries reach beside what this machine's threads read
    from a buffer of the weights' size (dnnkit._cpu.measure_read_gbps, best pass): streamed one way every
    pass, and alternating direction pass by pass, so that each pass starts on what the last left in the
    cores' L2s (as dnnkit's cells do). The alternating figure bounds any library's time on float32
    weights, and so the ratio: "ratio ceiling" is it over torch's GB/s."""
    rows = [(sec, name) for sec, name, *_ in plan if " B1 " in name and "_cell" in name and " train " not in name]
    if not rows:
        return
    print("\n## cells at batch 1: the weights' bytes a step against this machine's read bandwidth")
    hdr = ("problem", "weights MiB", "dnnkit GB/s", "torch GB/s", "read GB/s", "alternating GB/s",
           "dnnkit of alternating", "ratio ceiling")
    if args.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    read = {}
    for sec, name in rows:
        mode = name.split("_cell")[0]
        H = int(name.split(" H")[1].split()[0])
        nbytes = 4 * GATES[mode] * H * 2 * H  # W_ih and W_hh, input size = H
        if nbytes not in read:
            read[nbytes] = tuple(dnnkit._cpu.measure_read_gbps(nbytes, args.threads, 0.5, alternate=alt)
                                 for alt in (False, True))
        t_ours = float(np.median([t[0] for t in timings[sec, name]])) / CELL_STEPS
        t_torch = float(np.median([t[1] for t in timings[sec, name]])) / CELL_STEPS
        ours, theirs = nbytes / t_ours / 1e9, nbytes / t_torch / 1e9
        one_way, alternating = read[nbytes]
        cells = (name, f"{nbytes / 2**20:.1f}", f"{ours:.1f}", f"{theirs:.1f}", f"{one_way:.1f}",
                 f"{alternating:.1f}", f"{ours / alternating:.2f}", f"{alternating / theirs:.2f}")
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print(f"{cells[0]:<36} " + " ".join(f"{c:>14}" for c in cells[1:]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short subset")
    ap.add_argument("--long", action="store_true", help="only sequence inference at H512 B16, T 10 to 200")
    ap.add_argument("--threads", type=int, default=2, help="threads for both libraries (default 2)")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing per problem")
    ap.add_argument("--filter", default="", help="only problems whose name contains this")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables for bench/RESULTS.md")
    ap.add_argument("--passes", type=int, default=1,
                    help="time the whole list this many times and report medians over the passes")
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error("--passes must be 1 or more")
    import torch

    torch.set_num_threads(args.threads)
    dnnkit.set_num_threads(args.threads)
    budget = args.budget if args.budget is not None else (0.6 if args.quick else 1.5)
    info = dnnkit.info()
    print(f"# {info['cpu']} | {platform.machine()} | ISA {info['isa_active']} | threads {args.threads} | "
          f"torch {torch.__version__} | numpy {np.__version__} | float32")
    multi = args.passes > 1
    hdr = ("problem", "dnnkit ms", "torch ms", "ratio", "dnnkit GF/s") + (("ratio range",) if multi else ())
    ratios = {}

    def header(title):
        print(f"\n## {title}")
        if args.markdown:
            print("| " + " | ".join(hdr) + " |")
            print("|" + "---|" * len(hdr))
        else:
            print(f"{hdr[0]:<36} {hdr[1]:>10} {hdr[2]:>10} {hdr[3]:>6} {hdr[4]:>11}" + (f" {hdr[5]:>12}" if multi else ""))

    def row(group, name, timings, fl):
        # timings: one (dnnkit, torch) pair of medians per pass
        t_ours = float(np.median([t[0] for t in timings]))
        t_torch = float(np.median([t[1] for t in timings]))
        rs = [t[1] / t[0] for t in timings]
        ratio = float(np.median(rs))
        ratios.setdefault(group, []).append(ratio)
        gf = fl / t_ours / 1e9
        span = f"{min(rs):.2f}-{max(rs):.2f}"
        if args.markdown:
            print(f"| {name} | {1e3 * t_ours:.3f} | {1e3 * t_torch:.3f} | {ratio:.2f} | {gf:.1f} |"
                  + (f" {span} |" if multi else ""))
        else:
            print(f"{name:<36} {1e3 * t_ours:>10.3f} {1e3 * t_torch:>10.3f} {ratio:>6.2f} {gf:>11.1f}"
                  + (f" {span:>12}" if multi else ""))
        sys.stdout.flush()

    # Every problem as (section, name, the summary's group, a maker of its two calls, its flops).
    problems = LONG if args.long else QUICK if args.quick else FULL
    cells = [] if args.long else CELLS_QUICK if args.quick else CELLS_FULL
    plan = []
    for train in (False,) if args.long else (False, True):
        section = "training step (fwd+bwd)" if train else "sequence inference"
        for mode, H, B, T, L, *proj in problems:
            P = proj[0] if proj else 0
            name = f"{mode} H{H}{f' P{P}' if P else ''} B{B} T{T} L{L}"
            if args.filter and args.filter not in name:
                continue
            make = (lambda mode=mode, H=H, B=B, T=T, L=L, train=train, P=P, seed=len(plan):
                    sequence_calls(torch, mode, H, B, T, L, train, np.random.default_rng(seed), P))
            fl = flops(mode, H, B, T, L, P=P) * (3 if train else 1)
            plan.append((section, name, section + (" batch 1" if B == 1 else ""), make, fl))
    for packed in (False, True):
        section = (f"cell on weights packed once (dnnkit.pack_weight), {CELL_STEPS} steps in a Python loop" if packed
                   else f"cell, {CELL_STEPS} steps in a Python loop")
        for mode, H, B in cells:
            name = f"{mode}_cell{' packed' if packed else ''} H{H} B{B} x{CELL_STEPS}"
            if args.filter and args.filter not in name:
                continue
            make = (lambda mode=mode, H=H, B=B, seed=len(plan), packed=packed:
                    cell_calls(torch, mode, H, B, np.random.default_rng(seed), packed))
            plan.append((section, name, section, make, flops(mode, H, B, CELL_STEPS, 1)))
    section = f"cell training step: {CELL_STEPS} steps forward, then backward through time in a Python loop"
    for mode, H, B in cells:
        name = f"{mode}_cell train H{H} B{B} x{CELL_STEPS}"
        if args.filter and args.filter not in name:
            continue
        make = (lambda mode=mode, H=H, B=B, seed=len(plan):
                cell_training_calls(torch, mode, H, B, np.random.default_rng(seed)))
        plan.append((section, name, section + (" batch 1" if B == 1 else ""), make,
                     3 * flops(mode, H, B, CELL_STEPS, 1)))

    timings = {(sec, name): [] for sec, name, _, _, _ in plan}
    shown = None

    def show(entry):
        nonlocal shown
        sec, name, group, _, fl = entry
        if sec != shown:
            header(sec)
            shown = sec
        row(group, name, timings[sec, name], fl)

    for p in range(args.passes):
        if multi:
            print(f"# pass {p + 1} of {args.passes}", file=sys.stderr, flush=True)
        for entry in plan:
            ours, theirs = entry[3]()
            timings[entry[0], entry[1]].append(interleaved_medians([ours, theirs], budget, block=BLOCK))
            del ours, theirs
            if not multi:
                show(entry)
    if multi:
        for entry in plan:
            show(entry)
    bandwidth_table(plan, timings, args)
    print()
    for g, rs in ratios.items():
        gm = float(np.exp(np.mean(np.log(rs))))
        print(f"# {g}: geometric-mean ratio torch/dnnkit {gm:.2f} (min {min(rs):.2f}, max {max(rs):.2f}, n={len(rs)})")


if __name__ == "__main__":
    main()
