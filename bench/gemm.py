"""dnnkit GEMM and linear beside NumPy (OpenBLAS) and PyTorch (MKL) in one process.

    python bench/gemm.py [--problems FILE] [--threads N] [--budget SECONDS] [--filter TEXT] [--isa ISA] [--markdown]
                         [--passes N]

For each problem: the median time of dnnkit, NumPy and (when installed) torch (runs interleaved, so all
see the same machine state), GFLOP/s, the ratio to NumPy and to the faster of the two baselines (> 1:
dnnkit faster) and the fraction of the measured
float32 FMA peak (probed at the start of each pass; with AMX tiles on, products of 192 rows and
columns and more go past it, and the header gives the tiles' ceiling). Fully-connected problems ('tb') run as dnnkit.linear(x, W) against x @ W.T (torch.nn.functional.linear),
then again on W packed once before timing (dnnkit.pack_weight; rows "fc-packed:").
Then one thread at 2048^3 against the one-core peak, measured just before it. Then (when torch is
installed; rows "act:") linear with a fused activation, forward and a training step (forward and
linear_backward), beside torch.nn.functional.linear followed by the activation (and autograd's backward).
--passes N times the whole list N times over (each problem in N windows minutes apart, as a shared
machine's load changes) and reports the medians over the passes and the range of the ratio.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time

# NumPy's OpenBLAS as it runs by default: some environments set these, which select slower kernels
# (OPENBLAS_CORETYPE=Haswell runs AVX2 kernels on AVX-512 CPUs at half their speed). Unset in this
# process only, before NumPy loads OpenBLAS; main() prints the core OpenBLAS then runs.
UNSET_FOR_BASELINE = {v: os.environ.pop(v) for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if v in os.environ}

import numpy as np  # noqa: E402

import dnnkit  # noqa: E402
from dnnkit.problem import GemmProblem  # noqa: E402

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


def is_fc(p: GemmProblem) -> bool:
    return p.trans_b and not p.trans_a


def make_call(p: GemmProblem, rng, torch=None, packed=False):
    """(dnnkit call, NumPy call, torch call or None) for problem p, on the same arrays."""
    dt = np.dtype(p.dtype)
    if is_fc(p):  # a fully-connected layer: x (M x K), W (N x K)
        x = rng.standard_normal((p.m, p.k)).astype(dt)
        w = rng.standard_normal((p.n, p.k)).astype(dt)
        pw = dnnkit.pack_weight(w) if packed else w  # packed once, outside the timed call
        theirs = None
        if torch is not None:
            tx, tw = torch.from_numpy(x), torch.from_numpy(w)
            theirs = lambda: torch.nn.functional.linear(tx, tw)  # noqa: E731
        return (lambda: dnnkit.linear(x, pw)), (lambda: x @ w.T), theirs
    a = rng.standard_normal((p.k, p.m) if p.trans_a else (p.m, p.k)).astype(dt)
    b = rng.standard_normal((p.n, p.k) if p.trans_b else (p.k, p.n)).astype(dt)
    c = np.empty((p.m, p.n), dt)
    A = a.T if p.trans_a else a
    B = b.T if p.trans_b else b
    theirs = None
    if torch is not None:
        tA, tB, tc = torch.from_numpy(A), torch.from_numpy(B), torch.from_numpy(c)
        theirs = lambda: torch.mm(tA, tB, out=tc)  # noqa: E731
    return (lambda: dnnkit.gemm(a, b, c, trans_a=p.trans_a, trans_b=p.trans_b)), (lambda: np.matmul(A, B, out=c)), theirs


def blas_line() -> str:
    """The BLAS NumPy runs (threadpoolctl), and what of the environment was unset for it."""
    unset = f"; unset for it: {', '.join(f'{k}={v}' for k, v in UNSET_FOR_BASELINE.items())}" if UNSET_FOR_BASELINE else ""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"numpy {np.__version__} (pip install threadpoolctl to show its BLAS){unset}"
    libs = [f"{i.get('internal_api')} {i.get('version')} {i.get('architecture') or ''} {i.get('num_threads')} threads"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    return f"numpy {np.__version__} on {'; '.join(libs) or 'no BLAS found'}{unset}"


# linear with an activation beside torch: (M, N, K) = (rows of x, out_features, in_features).
ACT_SHAPES = ((3200, 1024, 256), (256, 4096, 1024), (64, 4096, 1024))
ACTS = ("relu", "tanh", "gelu")


def act_calls(m, n, k, act, train, rng, torch):
    """(dnnkit call, torch call) for linear + act on float32; with train, forward and backward."""
    import torch.nn.functional as F

    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    gy = rng.standard_normal((m, n)).astype(np.float32)
    tf = {"relu": torch.relu, "tanh": torch.tanh, "gelu": F.gelu}[act]
    tx, tw, tb, tgy = (torch.from_numpy(v.copy()) for v in (x, w, b, gy))
    if not train:
        def ours():
            return dnnkit.linear(x, w, b, activation=act)

        def theirs():
            with torch.no_grad():
                return tf(F.linear(tx, tw, tb))
        return ours, theirs

    def ours():
        y, z = dnnkit.linear(x, w, b, activation=act, return_preactivation=True)
        return dnnkit.linear_backward(gy, x, w, bias=True, activation=act, output=y, preactivation=z)

    for t in (tx, tw, tb):
        t.requires_grad_(True)

    def theirs():
        for t in (tx, tw, tb):
            t.grad = None
        tf(F.linear(tx, tw, tb)).backward(tgy)
        return tx.grad, tw.grad, tb.grad
    return ours, theirs


def act_rows(args, nt, rng):
    """The "act:" table: dnnkit.linear(..., activation=) beside torch, forward and training step."""
    try:
        import torch
    except ImportError:
        print("# act: torch is not installed (pip install -e .[bench]); rows skipped")
        return
    torch.set_num_threads(nt)
    plan = [(m, n, k, act, train) for train in (False, True) for (m, n, k) in ACT_SHAPES for act in ACTS]
    names = [f"act:{'train' if tr else 'fwd'} {act} {m}x{n}x{k}" for m, n, k, act, tr in plan]
    keep = [i for i, nm in enumerate(names) if not args.filter or args.filter in nm]
    if not keep:
        return
    times = {i: [] for i in keep}
    for _ in range(args.passes):
        for i in keep:
            ours, theirs = act_calls(*plan[i][:5], rng, torch)
            times[i].append(interleaved_medians([ours, theirs], args.budget))
    hdr = ["problem", "dnnkit ms", "torch ms", "ratio", "dnnkit GF/s"] + (["ratio range"] if args.passes > 1 else [])
    print(f"# linear with an activation beside torch {torch.__version__} ({nt} threads each); ratio = torch/dnnkit"
          " time (> 1: dnnkit faster); GF/s counts the GEMMs only (2MNK forward, 6MNK with the backward)")
    if args.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    ratios = []
    for i in keep:
        m, n, k, act, train = plan[i]
        t0 = float(np.median([t[0] for t in times[i]]))
        t1 = float(np.median([t[1] for t in times[i]]))
        rs = [t[1] / t[0] for t in times[i]]
        r = float(np.median(rs))
        ratios.append(r)
        g = (6 if train else 2) * m * n * k / t0 / 1e9
        span = f"{min(rs):.2f}-{max(rs):.2f}"
        cells = [names[i], f"{t0 * 1e3:.3f}", f"{t1 * 1e3:.3f}", f"{r:.2f}", f"{g:.1f}"] + ([span] if args.passes > 1 else [])
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print(f"{cells[0]:<34} " + " ".join(f"{c:>11}" for c in cells[1:]))
    gm = float(np.exp(np.mean(np.log(ratios))))
    print(f"# act: geometric-mean ratio torch/dnnkit {gm:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=os.path.join(HERE, "problems", "gemm.txt"))
    ap.add_argument("--threads", type=int, default=None, help="dnnkit threads (default: all cores)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing per problem")
    ap.add_argument("--filter", default="", help="only problems whose name contains this")
    ap.add_argument("--isa", choices=("ref", "avx2", "avx512"), help="use this ISA's micro-kernels (default: the best)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table for bench/RESULTS.md")
    ap.add_argument("--passes", type=int, default=1,
                    help="time the whole list this many times and report medians over the passes")
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error("--passes must be 1 or more")
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
    try:
        import torch
        torch.set_num_threads(nt)
        torch_line = f"torch {torch.__version__} ({torch.backends.mkl.is_available() and 'MKL' or 'no MKL'})"
    except ImportError:
        torch, torch_line = None, "torch not installed: NumPy alone (pip install -e .[bench])"
    print(f"# measured fp32 peak: {peak:.1f} GFLOP/s on {nt} threads, {peak1:.1f} on one")
    print(f"# baselines: {blas_line()} | {torch_line}")
    if info["amx"]:
        # float32 products of 192 rows and columns and more run on AMX tiles, six bfloat16 part products
        # each: their ceiling is the tiles' peak / 6, past the FMA peak "% peak" is taken of.
        tiles = dnnkit._cpu.measure_amx_peak_gflops(nt, 0.5)
        print(f"# AMX tiles on: bfloat16 tile peak {tiles:.0f} GFLOP/s on {nt} threads; float32 through them "
              f"at most {tiles / 6:.0f} ({tiles / 6 / peak:.2f}x the FMA peak)")
    def probe(threads):
        # A fresh measurement (dnnkit.machine.peak_gflops keeps its first one for the process).
        return dnnkit._cpu.measure_peak_gflops(info["isa_active"], threads, 0.5)

    multi = args.passes > 1
    rows = []
    hdr = (["problem", "descriptor", "dnnkit GF/s", "numpy GF/s", "torch GF/s", "vs numpy", "vs best", "% peak"]
           + (["vs best range"] if multi else []))

    def header():
        if args.markdown:
            print("| " + " | ".join(hdr) + " |")
            print("|" + "---|" * len(hdr))
        else:
            print(f"{hdr[0]:<26} {hdr[1]:<24} " + " ".join(f"{h:>11}" for h in hdr[2:]))

    def show(p, name, timings):
        # timings: one (dnnkit, numpy[, torch]) tuple of medians per pass; "vs best": against the faster
        # baseline of each pass
        t_ours = float(np.median([t[0] for t in timings]))
        t_np = float(np.median([t[1] for t in timings]))
        t_torch = float(np.median([t[2] for t in timings])) if len(timings[0]) > 2 else float("nan")
        rs = [min(t[1:]) / t[0] for t in timings]
        g_ours, g_np, g_torch = (p.flops / t / 1e9 for t in (t_ours, t_np, t_torch))
        # Against the probe of the same pass: the machine's speed moves between passes.
        frac = float(np.median([p.flops / t[0] / 1e9 / pk for t, pk in zip(timings, peaks)]))
        row = (name, p.descriptor(), g_ours, g_np, g_torch, t_np / t_ours, float(np.median(rs)), 100 * frac)
        rows.append(row)
        span = f"{min(rs):.2f}-{max(rs):.2f}"
        cells = [row[0], f"`{row[1]}`" if args.markdown else row[1], f"{row[2]:.1f}", f"{row[3]:.1f}",
                 f"{row[4]:.1f}", f"{row[5]:.2f}", f"{row[6]:.2f}", f"{row[7]:.0f}%"] + ([span] if multi else [])
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print(f"{cells[0]:<26} {cells[1]:<24} " + " ".join(f"{c:>11}" for c in cells[2:]))
        sys.stdout.flush()

    # Each fully-connected problem twice: on the weight as given, then packed once by dnnkit.pack_weight
    # ("fc-packed:"; NumPy has no such form, so its side is the same x @ W.T).
    problems = read_problems(args.problems)
    problems += [(p, "fc-packed:" + name.split(":", 1)[-1]) for p, name in problems if is_fc(p)]
    plan = [(p, name) for p, name in problems if not args.filter or args.filter in name]
    timings = {name: [] for _, name in plan}
    single = []  # per pass: (GFLOP/s on one thread at 2048^3, the one-core peak measured just before)
    peaks = []  # the two-thread probe at the start of each pass
    if not multi:
        header()
    for k in range(args.passes):
        if multi:
            print(f"# pass {k + 1} of {args.passes}", file=sys.stderr, flush=True)
        peaks.append(peak if k == 0 else probe(nt))
        rng = np.random.default_rng(0)
        for p, name in plan:
            calls = [f for f in make_call(p, rng, torch, packed=name.startswith("fc-packed:")) if f is not None]
            timings[name].append(tuple(interleaved_medians(calls, args.budget * len(calls) / 2)))
            del calls
            if not multi:
                show(p, name, timings[name])
        # One thread at 2048^3 against the one-core peak.
        if not args.filter or args.filter in "single-thread":
            dnnkit.set_num_threads(1)
            n = 2048
            a = rng.standard_normal((n, n)).astype(np.float32)
            b = rng.standard_normal((n, n)).astype(np.float32)
            c = np.empty((n, n), np.float32)
            p1 = probe(1)
            (t1,) = interleaved_medians([lambda: dnnkit.gemm(a, b, c)], args.budget * 2)
            single.append((2 * n**3 / t1 / 1e9, p1))
            dnnkit.set_num_threads(nt)
    if multi:
        print(f"# the two-thread probe at the start of each pass: {', '.join(f'{pk:.1f}' for pk in peaks)} GFLOP/s")
        header()
        for p, name in plan:
            show(p, name, timings[name])
    if single:
        fr = [g / p1 for g, p1 in single]
        g1 = float(np.median([g for g, _ in single]))
        span = f" (range {100 * min(fr):.0f}-{100 * max(fr):.0f}% over {len(fr)} passes)" if multi else ""
        print(f"# one thread, 2048^3: {g1:.1f} GFLOP/s = {100 * float(np.median(fr)):.0f}% of the one-core peak "
              f"{float(np.median([p1 for _, p1 in single])):.1f} measured just before{span}")
    act_rows(args, nt, np.random.default_rng(1))
    groups = {}
    for row in rows:
        groups.setdefault(row[0].split(":")[0], []).append(row[5:7])
    for g, ratios in groups.items():
        gm_np, gm_best = (float(np.exp(np.mean(np.log([r[i] for r in ratios])))) for i in (0, 1))
        print(f"# {g}: geometric mean dnnkit vs numpy {gm_np:.2f}, vs the faster baseline {gm_best:.2f} "
              f"(min {min(r[1] for r in ratios):.2f}, max {max(r[1] for r in ratios):.2f})")


if __name__ == "__main__":
    main()
