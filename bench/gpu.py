"""dnnkit on a GPU, in one run: versions, where one call's time goes, the benchmark beside cuBLAS and cuDNN
(through PyTorch, TF32 off), the GPU tests at real sizes, compute-sanitizer on a small subset.

  python bench/gpu.py --all [--out DIR]      everything below but --subset, in this order
  python bench/gpu.py --overhead             one GEMM call's host and GPU time, layer by layer, and its profile
  python bench/gpu.py --bench [--quick]      SGEMM and fully-connected shapes, LSTM/GRU sequences
  python bench/gpu.py --tests                pytest tests/gpu on the GPU (the `gpu` marker's real sizes too)
  python bench/gpu.py --sanitize             compute-sanitizer memcheck and racecheck on --subset
  python bench/gpu.py --subset               (what the sanitizer runs) a few small calls of each GPU kernel

Timing: CUDA events on the current stream around each call, medians of --reps calls after warm-up (the
first call compiles the kernels), each call on the next of several copies of the operands (so that no
call finds its inputs in L2 where the last left them). dnnkit and the baseline run in one process, one
after the other per shape; ratios are dnnkit's speed over the baseline's. float32 rows run with TF32 off in
cuBLAS and cuDNN. Writes gpu_bench.csv (and the test and sanitizer logs) under --out.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import os
import subprocess
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

GEMM_SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
               # fully-connected layers: batch x out x in (ResNet-50's classifier, a transformer MLP, an LSTM's input GEMM)
               (64, 1000, 2048), (512, 4096, 1024), (3200, 2048, 512), (1, 4096, 4096), (16, 1024, 4096)]
RNN_SHAPES = [  # mode, hidden, batch, steps
    ("lstm", 512, 64, 50), ("lstm", 1024, 1, 25), ("lstm", 1024, 32, 50), ("lstm", 2048, 128, 25),
    ("lstm", 512, 1, 100), ("gru", 512, 64, 50), ("gru", 1024, 1, 25), ("gru", 2048, 16, 25)]
STACK_SHAPES = [("lstm", 512, 16, 50, 4), ("gru", 1024, 4, 25, 3)]  # mode, hidden, batch, steps, layers
TEST_WORKERS = 8  # pytest processes sharing the GPU in --tests
TESTS_TIMEOUT, SANITIZER_TIMEOUT = 150, 60  # seconds: what is left of a stage past these is cut, the rest still runs
QUICK = {"gemm": 5, "rnn": 4}
H100_FP32_PEAK = 67e12  # dense FP32 FLOP/s of an H100 SXM: the fraction of the peak where the GPU's own is unknown


def sh(cmd, log=None, timeout=None) -> int:
    """Runs cmd (its output to log, whose tail is printed); 124 where it ran past timeout seconds."""
    print("$ " + " ".join(cmd), flush=True)
    with open(log or os.devnull, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f if log else None, stderr=subprocess.STDOUT if log else None,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"(stopped after {timeout} s)")
            rc = 124
    if log:
        with open(log) as f:
            print(f.read()[-3000:])
    return rc


def versions() -> None:
    sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv"])
    sh([sys.executable, "-m", "pip", "show", "numba", "numba-cuda", "cupy-cuda13x", "torch"])
    with guarded("dnnkit.info"):
        import dnnkit

        print(dnnkit.info(gpu=True)["backends"]["cuda"])


def tests(out: str) -> int:
    """The GPU tests, over several processes where pytest-xdist is installed: most of their time on a GPU
    is each kernel variant's first compilation, which runs on the host, one core a process."""
    # test_codegen.py needs no GPU and runs in the main suite
    gpu_tests = os.path.join(ROOT, "tests", "gpu")
    workers = min(TEST_WORKERS, os.cpu_count() or 1)
    spread = ["-n", str(workers)] if workers > 1 and importlib.util.find_spec("xdist") is not None else []
    return sh([sys.executable, "-m", "pytest", "-v", "--tb=short", "-rfE", "-p", "no:cacheprovider", *spread,
               gpu_tests, "--ignore", os.path.join(gpu_tests, "test_codegen.py")],
              os.path.join(out, "gpu_tests.log"), timeout=TESTS_TIMEOUT)


def subset() -> None:
    """Small calls of every GPU kernel: the sanitizer's workload."""
    import torch

    import dnnkit

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*s):
        return torch.rand(*s, device=dev, generator=g) - 0.5

    for algo in ("gemm_tiled_128x128", "gemm_tiled_64x64", "gemm_tiled_32x32"):
        dnnkit.gemm(r(130, 70), r(70, 67), algo=algo)
        dnnkit.gemm(r(70, 130), r(67, 70), trans_a=True, trans_b=True, algo=algo)
    dnnkit.gemm(r(5, 1100), r(1100, 67), algo="gemm_splitk")
    x, w, b = r(33, 65), r(17, 65), r(17)
    y, z = dnnkit.linear(x, w, b, activation="gelu", return_preactivation=True)
    dnnkit.linear_backward(r(33, 17), x, w, activation="gelu", preactivation=z)
    for mode in ("lstm", "gru", "rnn_tanh"):
        G = {"lstm": 4, "gru": 3, "rnn_tanh": 1}[mode]
        ws = [r(G * 33, 9), r(G * 33, 33), r(G * 33), r(G * 33)] * 2
        fn = {"lstm": lambda: dnnkit.lstm(r(5, 3, 9), None, None, ws, bidirectional=True),
              "gru": lambda: dnnkit.gru(r(5, 3, 9), None, ws, bidirectional=True),
              "rnn_tanh": lambda: dnnkit.rnn(r(5, 3, 9), None, ws, bidirectional=True)}[mode]
        fn()
    ws = [r(4 * 40, 9), r(4 * 40, 40), r(4 * 40), r(4 * 40), r(4 * 40, 40), r(4 * 40, 40), r(4 * 40), r(4 * 40)]
    for algo in ("gpu_persistent", "gpu_wavefront"):  # every SM's block behind the grid barrier; streams
        out, _, reserve = dnnkit.lstm(r(6, 3, 9), None, None, ws, num_layers=2, train=True, algo=algo)
        dnnkit.lstm_backward(r(6, 3, 40), None, None, reserve)
    torch.cuda.synchronize()
    print("subset done")


def sanitize(out: str) -> int:
    rc = 0
    for tool in ("memcheck", "racecheck"):
        # API errors are not reported: the CUDA bindings probe the driver for entry points it may lack
        rc |= sh(["compute-sanitizer", "--tool", tool, "--report-api-errors", "no", "--error-exitcode", "3",
                  sys.executable, __file__, "--subset"],
                 os.path.join(out, f"sanitizer_{tool}.log"), timeout=SANITIZER_TIMEOUT)
    return rc


@contextlib.contextmanager
def guarded(label: str):
    """One benchmark row: a failure is printed and the run goes on to the next."""
    try:
        yield
    except Exception:
        print(f"FAILED {label}:\n{traceback.format_exc()}", flush=True)


def _time(fn, reps: int) -> float:
    """Median seconds of fn() between CUDA events on the current stream."""
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def overhead(out: str, reps: int = 20) -> None:
    """Where one GEMM call's time goes: host seconds (perf_counter around the call, the GPU idle before
    it) and event seconds of each layer from dnnkit.gemm down to a bare Numba launch, beside torch.mm; and
    a profile of dnnkit.gemm's host time (profile.txt)."""
    import cProfile
    import io
    import pstats

    import torch

    import dnnkit
    from dnnkit.backends import cuda as cb
    from dnnkit.dispatch import plan as make_plan
    from dnnkit.kernels import gemm as kg
    from dnnkit.problem import GemmProblem

    m = n = k = 1024
    a, b = torch.rand(m, k, device="cuda") - 0.5, torch.rand(k, n, device="cuda") - 0.5
    c = torch.empty(m, n, device="cuda")
    plan = make_plan(GemmProblem(m, n, k, dtype="float32", device="cuda"), "gemm_tiled_64x64")
    da, db, dc = (cb.adopt("gemm", name, x) for name, x in (("a", a), ("b", b), ("c", c)))
    st = cb.stream_for("gemm", None, a)
    tile = kg.TILES["64x64"]
    kern = kg.gemm_kernel(tile, "float32", False, False)
    grid = (-(-n // tile.bn), -(-m // tile.bm), 1)
    args = (da, db, dc, dc[0], m, n, k, np.float32(1.0), np.float32(0.0), k)
    cases = [
        ("dnnkit.gemm(torch tensors)", lambda: dnnkit.gemm(a, b, c, algo="gemm_tiled_64x64")),
        ("plan.run(Numba views, torch's stream)", lambda: plan.run(da, db, out=dc, stream=st)),
        ("plan.run(Numba views, default stream)", lambda: plan.run(da, db, out=dc)),
        ("kernel[grid, block, torch's stream]", lambda: kern[grid, tile.threads, st](*args)),
        ("kernel[grid, block] (default stream)", lambda: kern[grid, tile.threads](*args)),
        ("adopt(a) (no launch)", lambda: cb.adopt("gemm", "a", a)),
        ("stream_for (no launch)", lambda: cb.stream_for("gemm", None, a)),
        ("torch.mm", lambda: torch.mm(a, b, out=c)),
    ]
    print(f"\n{'1024^3 float32 GEMM: one call of':<42} {'host ms':>9} {'event ms':>9}")
    for name, fn in cases:
        with guarded(name):
            fn()
            torch.cuda.synchronize()
            host = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                host.append(time.perf_counter() - t)
                torch.cuda.synchronize()
            print(f"{name:<42} {np.median(host) * 1e3:>9.3f} {_time(fn, reps) * 1e3:>9.3f}", flush=True)
    with guarded("profile"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            dnnkit.gemm(a, b, c, algo="gemm_tiled_64x64")
        torch.cuda.synchronize()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
        with open(os.path.join(out, "profile.txt"), "w") as f:
            f.write(text.getvalue())
        print("\n".join(text.getvalue().splitlines()[:40]))


def bench(out: str, quick: bool, reps: int) -> list:
    import torch

    import dnnkit

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    rows = []
    from dnnkit.backends import cuda as cuda_backend

    ceil = cuda_backend.ceilings() or {"fp32_flops": H100_FP32_PEAK, "tf32_flops": 495e12}
    print("ceilings:", ceil)

    def row(kind, shape, flops, t_dk, t_base, baseline, algo=""):
        rows.append({"kind": kind, "shape": shape, "dnnkit_ms": round(t_dk * 1e3, 4), "baseline": baseline,
                     "baseline_ms": round(t_base * 1e3, 4), "ratio": round(t_base / t_dk, 3),
                     "dnnkit_tflops": round(flops / t_dk / 1e12, 2), "baseline_tflops": round(flops / t_base / 1e12, 2),
                     "dnnkit_peak_frac": round(flops / t_dk / ceil["tf32_flops" if "tf32" in kind else "fp32_flops"], 3),
                     "algo": algo})
        print(rows[-1], flush=True)
        with open(os.path.join(out, "gpu_bench.csv"), "w", newline="") as f:  # each row as it comes
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)

    gemms = GEMM_SHAPES[:QUICK["gemm"]] if quick else GEMM_SHAPES
    for m, n, k in gemms:
        with guarded(f"gemm {m}x{n}x{k}"):
            copies = max(1, min(4, int(2e9 // (4 * (m * k + k * n + m * n)))))
            ops = [(torch.rand(m, k, device=dev) - 0.5, torch.rand(n, k, device=dev) - 0.5) for _ in range(copies)]
            c = torch.empty(m, n, device=dev)
            i = [0]

            def nxt():
                i[0] = (i[0] + 1) % copies
                return ops[i[0]]

            # the tuned choice for this shape (the tuner on the GPU, CUDA events), then dnnkit as a user calls it
            x, w = ops[0]
            from dnnkit.autotune.tuner import find
            from dnnkit.problem import GemmProblem

            best = "auto"
            with guarded(f"tuning gemm {m}x{n}x{k}"):
                res = find(GemmProblem(m, n, k, trans_b=True, device="cuda"), budget=2.0)
                best = res.best.algorithm if res.best else "auto"
            for _ in range(2):
                dnnkit.gemm(x, w, c, trans_b=True, algo=best)
                torch.mm(x, w.T, out=c)
            torch.cuda.synchronize()
            t_dk = _time(lambda: dnnkit.gemm(*nxt(), c, trans_b=True, algo=best), reps)
            t_base = _time(lambda: (lambda o: torch.mm(o[0], o[1].T, out=c))(nxt()), reps)
            row("gemm_f32", f"{m}x{n}x{k}", 2 * m * n * k, t_dk, t_base, "torch.mm (cuBLAS, TF32 off)", best)

    shapes = RNN_SHAPES[:QUICK["rnn"]] if quick else RNN_SHAPES
    for mode, H, B, T in shapes:
        with guarded(f"{mode} H{H} B{B} T{T}"):
            G = 4 if mode == "lstm" else 3
            mod = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(H, H, num_layers=1).to(dev).eval()
            ws = [p.detach() for p in mod.parameters()]
            x = torch.rand(T, B, H, device=dev) - 0.5
            with torch.no_grad():
                for _ in range(2):
                    (dnnkit.lstm(x, None, None, ws) if mode == "lstm" else dnnkit.gru(x, None, ws))
                    mod(x)
                torch.cuda.synchronize()
                def call():
                    return dnnkit.lstm(x, None, None, ws) if mode == "lstm" else dnnkit.gru(x, None, ws)

                t_dk = _time(call, reps)
                t_base = _time(lambda: mod(x), reps)
            flops = 2 * T * B * G * H * (H + H)
            row(f"{mode}_fwd_f32", f"H{H} B{B} T{T}", flops, t_dk, t_base, "torch.nn (cuDNN, TF32 off)", "gpu_steps")
            # the persistent kernel where W_hh fits the GPU's shared memory, beside the same baseline
            from dnnkit.algos.rnn_cuda import GpuPersistent
            from dnnkit.problem import RnnProblem

            if GpuPersistent(mode).supports(RnnProblem(mode, T, B, H, H, device="cuda")) is None:
                def persistent():
                    kw = dict(algo="gpu_persistent")
                    return dnnkit.lstm(x, None, None, ws, **kw) if mode == "lstm" else dnnkit.gru(x, None, ws, **kw)

                with torch.no_grad():
                    persistent()
                    torch.cuda.synchronize()
                    t_p, t_base = _time(persistent, reps), _time(lambda: mod(x), reps)
                row(f"{mode}_fwd_f32", f"H{H} B{B} T{T}", flops, t_p, t_base, "torch.nn (cuDNN, TF32 off)",
                    "gpu_persistent")

    # stacks: every GPU sequence algorithm on a multi-layer LSTM/GRU beside cuDNN's (one module)
    from dnnkit.algos.rnn_cuda import ALGORITHMS as RNN_ALGORITHMS
    from dnnkit.problem import RnnProblem

    for mode, H, B, T, L in STACK_SHAPES[:1] if quick else STACK_SHAPES:
        with guarded(f"{mode} stack H{H} B{B} T{T} L{L}"):
            G = 4 if mode == "lstm" else 3
            mod = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(H, H, num_layers=L).to(dev).eval()
            ws = [p.detach() for p in mod.parameters()]
            x = torch.rand(T, B, H, device=dev) - 0.5
            prob = RnnProblem(mode, T, B, H, H, layers=L, device="cuda")
            flops = L * 2 * T * B * G * H * (H + H)
            for a in RNN_ALGORITHMS:
                if a.op != f"{mode}_fwd" or a.supports(prob) is not None:
                    continue

                def call(name=a.name):
                    kw = dict(num_layers=L, algo=name)
                    return dnnkit.lstm(x, None, None, ws, **kw) if mode == "lstm" else dnnkit.gru(x, None, ws, **kw)

                with torch.no_grad():
                    call()
                    mod(x)
                    torch.cuda.synchronize()
                    t_dk, t_base = _time(call, reps), _time(lambda: mod(x), reps)
                row(f"{mode}_stack_f32", f"H{H} B{B} T{T} L{L}", flops, t_dk, t_base, "torch.nn (cuDNN, TF32 off)",
                    a.name)

    # TF32 on the tensor cores beside cuBLAS's TF32 (both allowed to round), at 4096^3
    with guarded("gemm_tf32 4096"):
        m = n = k = 4096
        a, w = torch.rand(m, k, device=dev) - 0.5, torch.rand(n, k, device=dev) - 0.5
        c = torch.empty(m, n, device=dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        for _ in range(2):
            dnnkit.gemm(a, w, c, trans_b=True, algo="gemm_tf32")
            torch.mm(a, w.T, out=c)
        t_dk = _time(lambda: dnnkit.gemm(a, w, c, trans_b=True, algo="gemm_tf32"), reps)
        t_base = _time(lambda: torch.mm(a, w.T, out=c), reps)
        torch.backends.cuda.matmul.allow_tf32 = False
        row("gemm_tf32", f"{m}x{n}x{k}", 2 * m * n * k, t_dk, t_base, "torch.mm (cuBLAS, TF32 on)", "gemm_tf32")

    # training steps: the forward with train=True and the backward through time, beside torch's autograd
    for mode, H, B, T in shapes[:3] + [s for s in shapes if s[0] == "gru"][:1]:
        with guarded(f"{mode} train H{H} B{B} T{T}"):
            G = 4 if mode == "lstm" else 3
            mod = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(H, H, num_layers=1).to(dev)
            ws = [p.detach() for p in mod.parameters()]
            x = torch.rand(T, B, H, device=dev) - 0.5
            gy = torch.rand(T, B, H, device=dev) - 0.5

            def dk_step():
                if mode == "lstm":
                    out, _, r = dnnkit.lstm(x, None, None, ws, train=True)
                    dnnkit.lstm_backward(gy, None, None, r)
                else:
                    out, _, r = dnnkit.gru(x, None, ws, train=True)
                    dnnkit.gru_backward(gy, None, r)

            xg = x.clone().requires_grad_(True)

            def torch_step():
                out, _ = mod(xg)
                out.backward(gy)

            for _ in range(2):
                dk_step()
                torch_step()
            torch.cuda.synchronize()
            t_dk, t_base = _time(dk_step, reps), _time(torch_step, reps)
            flops = 3 * 2 * T * B * G * H * (H + H)
            row(f"{mode}_train_f32", f"H{H} B{B} T{T}", flops, t_dk, t_base, "torch.nn + autograd (cuDNN, TF32 off)",
                "gpu_steps")

    print(f"\n{'kind':<14} {'shape':<18} {'dnnkit ms':>10} {'base ms':>10} {'ratio':>7} {'TFLOP/s':>8} {'peak':>6}  algo")
    for r in rows:
        print(f"{r['kind']:<14} {r['shape']:<18} {r['dnnkit_ms']:>10} {r['baseline_ms']:>10} {r['ratio']:>7} "
              f"{r['dnnkit_tflops']:>8} {r['dnnkit_peak_frac']:>6}  {r['algo']}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--tests", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--subset", action="store_true")
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the first shapes of each table only")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.subset:
        subset()
        return 0
    rc = 0
    t0 = time.time()
    if args.all or args.tests or args.sanitize or args.bench or args.overhead:
        versions()
    if args.all or args.overhead:
        overhead(args.out)
    if args.all or args.bench:
        bench(args.out, args.quick, args.reps)
    if args.all or args.tests:
        rc |= tests(args.out)
    if args.all or args.sanitize:
        rc |= sanitize(args.out)
    print(f"bench/gpu.py: {time.time() - t0:.0f} s, exit {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
