"""The `dnnkit` command line (also `python -m dnnkit`).

  dnnkit info [--json] [--peak]
  dnnkit explain DESCRIPTOR [--direction D] [--dtype T]
  dnnkit autotune conv2d --input N,C,H,W --weight K,C,R,S [--stride --padding (P[,P]|same|valid) --dilation --groups]
  dnnkit autotune --problem DESCRIPTOR ... | --batch FILE | --model resnet50|lstm|fc [--mb N]
                  [--direction D] [--dtype T] [--budget S] [--workspace-limit BYTES] [--force]
                  [--no-prune] [--json] [--plot FILE.png]
  dnnkit cache path | list [--json] | show DESCRIPTOR|KEY | clear (PATTERN [--device any] | --all) [--yes] |
               export FILE | import FILE

Errors are one line on stderr, "dnnkit: error: ...", with exit status 2: bad arguments, a tuning cache
that cannot be resolved, opened, read or written (where the library would warn and keep its results in
memory), and an `autotune` that could tune none of its problems. An `autotune` that tuned some of them
but not all names each of the others on stderr, with exit status 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump), as every dnnkit error is."""

    def error(self, message):
        self.exit(2, f"dnnkit: error: {message}\n")


# The stores this command made strict (main() restores them): a cache the command cannot use is its error.
_STRICT_STORES: list = []


def _store():
    """The default tuning cache, strict for this command: one that cannot be resolved, opened, read or
    written raises CacheError (main() prints it as the command's one-line error), never a warning and a
    store in memory."""
    from .autotune import cache

    cache.cache_path()  # CacheError where DNNKIT_CACHE_DIR (or the home directory) cannot be resolved
    store = cache.default_store()
    if not store.strict:
        store.strict = True
        _STRICT_STORES.append(store)
    return store


# ------------------------------------------------------------------------------------------------- info
def _cmd_info(args) -> int:
    import dnnkit

    info = dnnkit.info()
    if args.peak:
        from .autotune.cost_model import ceilings

        info["peak_gflops_fp32"] = round(dnnkit.machine.peak_gflops(), 1)
        used = ceilings()
        info["cost_model_peak"] = f"{used['peak_flops'] / 1e9:.1f} GFLOP/s, {used['source']}"
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "backends":
            for name, b in value.items():
                state = "available" if b["available"] else f"unavailable: {b['reason']}"
                if name == "cuda" and b["available"]:
                    state += f", driver {b['driver']}; GPU kernels for {', '.join(b['kernels']) or 'no operator yet'}"
                print(f"{'backend ' + name:<18} {state}")
                for i, d in enumerate(b.get("devices", ())):
                    print(f"{'  gpu ' + str(i):<18} {d['name']}, compute capability {d['compute_capability']}, "
                          f"{d['sm_count']} SMs, {d['memory_bytes'] / 2**30:.0f} GiB")
                    c = dnnkit.backends.cuda.ceilings(i)
                    if c:
                        print(f"{'  gpu ' + str(i) + ' peak':<18} FP32 {c['fp32_flops'] / 1e12:.1f} TFLOP/s, TF32 "
                              f"{c['tf32_flops'] / 1e12:.0f} TFLOP/s, DRAM {c['bytes_per_s'] / 1e12:.2f} TB/s (nominal)")
        elif key == "ukernels":
            for dtype, u in value.items():
                print(f"{'ukernel ' + dtype:<18} {u['ukernel']}  MC={u['MC']} KC={u['KC']} NC={u['NC']}  "
                      f"strided-A {u['strided_a']}")
        else:
            print(f"{key:<18} {value}")
    return 0


def _descriptor_kind(text: str) -> str | None:
    """The grammar descriptor text follows, "gemm", "rnn" or "conv" (as parse_descriptor tries them), or None
    where it follows none (parse_descriptor then says why)."""
    from .problem import RNN_MODES, ConvProblem, GemmProblem

    if text.strip().startswith(RNN_MODES):
        return "rnn"
    for kind, parse in (("gemm", GemmProblem.parse), ("conv", ConvProblem.parse)):
        try:
            parse(text)
            return kind
        except ValueError:
            pass
    return None


# The directions each kind of descriptor takes: a GEMM has none but the default.
_DIRECTIONS = {"gemm": ("fwd",), "rnn": ("fwd", "bwd"), "conv": ("fwd", "bwd_data", "bwd_filter")}
_KIND_NAMES = {"gemm": "a GEMM descriptor", "rnn": "an RNN descriptor", "conv": "a convolution descriptor"}
_TAKES = {"gemm": "has no direction (fwd only)", "rnn": "takes fwd or bwd", "conv": "takes fwd, bwd_data or bwd_filter"}


def _check_direction(command: str, text: str, direction: str | None) -> str | None:
    """The kind of descriptor text (as _descriptor_kind); ValueError naming command and --direction where
    direction is not one that kind takes: a GEMM none (fwd, the default, only), an RNN fwd or bwd, a
    convolution fwd, bwd_data or bwd_filter."""
    kind = _descriptor_kind(text)
    if kind is None or direction is None or direction in _DIRECTIONS[kind]:
        return kind
    raise ValueError(f"{command}: --direction {direction} does not apply to {text.strip()!r}, "
                     f"{_KIND_NAMES[kind]}, which {_TAKES[kind]}")


def _cmd_explain(args) -> int:
    import dnnkit

    kind = _check_direction("explain", args.problem, args.direction)
    kwargs = {}
    if args.direction and kind != "gemm":  # a GEMM's only direction, fwd, is no keyword of its grammar
        kwargs["direction"] = args.direction
    if args.dtype:
        kwargs["dtype"] = args.dtype
    print(dnnkit.explain(args.problem, **kwargs))
    return 0


# --------------------------------------------------------------------------------------------- autotune
def _bytes_arg(text: str) -> int:
    """'1048576', '64K', '64M', '2G' (binary units) -> bytes (_config.parse_bytes, as DNNKIT_WORKSPACE_LIMIT)."""
    from ._config import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ints_arg(n):
    def parse(text: str):
        try:
            v = tuple(int(s) for s in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {n} comma-separated ints, got {text!r}") from None
        if len(v) != n:
            raise argparse.ArgumentTypeError(f"expected {n} comma-separated ints, got {text!r}")
        return v
    return parse


def _pair_arg(text: str):
    try:
        v = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or a pair 'H,W', got {text!r}") from None
    if len(v) not in (1, 2):
        raise argparse.ArgumentTypeError(f"expected an int or a pair 'H,W', got {text!r}")
    return v[0] if len(v) == 1 else v


def _padding_arg(text: str):
    """--padding: an int, a pair 'H,W', or "same" or "valid" as conv2d's padding argument takes them."""
    if text.strip() in ("same", "valid"):
        return text.strip()
    try:
        return _pair_arg(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an int, a pair 'H,W', 'same' or 'valid', got {text!r}") from None


def _budget_arg(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text!r}")
    return v


def _problems(args) -> list:
    from .autotune.models import load_batch, model_problems
    from .ops.convolution import _grown, _odd_same
    from .problem import ConvProblem, parse_descriptor

    sources = [bool(args.op), bool(args.problem), bool(args.batch), bool(args.model)]
    if sum(sources) != 1:
        raise ValueError("autotune: give exactly one of: conv2d --input/--weight, --problem, --batch, --model")
    if args.mb is not None and not args.model:
        raise ValueError("autotune: --mb sets the minibatch of --model's layers; a descriptor carries its own (mb<N>)")
    dtype, direction = args.dtype, args.direction
    if args.op == "conv2d":
        if args.input is None or args.weight is None:
            raise ValueError("autotune conv2d: --input N,C,H,W and --weight K,C/groups,R,S are required")
        if direction not in _DIRECTIONS["conv"]:
            raise ValueError(f"autotune conv2d: --direction {direction} does not apply to a convolution, which "
                             f"{_TAKES['conv']}")
        shape, padding = args.input, args.padding
        odd = _odd_same(args.weight, args.stride, padding, args.dilation)
        if odd is not None and (args.device != "cuda" or direction == "bwd_data"):
            # Where 'same' pads one more on the bottom/right, the array call (conv2d and its backward filter on
            # the CPU, its backward data everywhere) runs the problem of the input grown by that row/column,
            # padded symmetrically: that problem is the one tuned.
            shape, padding = _grown(shape, odd), odd[1]
        return [ConvProblem.from_arrays(shape, args.weight, args.stride, padding, args.dilation,
                                        args.groups, direction=direction, dtype=dtype, device=args.device,
                                        op="autotune conv2d")]
    if args.problem:
        out = []
        for text in args.problem:
            _check_direction("autotune --problem", text, direction)
            try:
                out.append(parse_descriptor(text, direction=direction, dtype=dtype, device=args.device))
            except ValueError as e:
                raise ValueError(f"autotune: {e}") from None
        return _on_device(out, args.device)
    if args.batch:
        out = load_batch(args.batch, direction=direction, dtype=dtype)
    else:
        out = model_problems(args.model, mb=8 if args.mb is None else args.mb, direction=direction, dtype=dtype)
    return _on_device(out, args.device)


def _on_device(problems, device: str) -> list:
    """The problems on --device: with cuda, each one on the GPU (a descriptor's own _cuda stays)."""
    if device != "cuda":
        return problems
    out = []
    for p in problems:
        try:
            out.append(p if p.device == "cuda" else dataclasses.replace(p, device="cuda"))
        except ValueError as e:
            raise ValueError(f"autotune --device cuda: {p.descriptor()} cannot run on the GPU ({e})") from None
    return out


def _check_gpu(problems) -> None:
    """ValueError saying why the GPU problems cannot be tuned here: an operator without CUDA kernels, or no
    usable GPU (no driver or device, numba-cuda missing)."""
    from . import algos
    from .backends import cuda as cuda_backend

    gpu = [p for p in problems if p.device == "cuda"]
    if not gpu:
        return
    missing = sorted({p.op for p in gpu if not algos.algorithms(p.op, "cuda")})
    if missing:
        have = sorted({a.op for a in algos.all_algorithms() if a.backend == "cuda"})
        raise ValueError(f"autotune --device cuda: dnnkit has no CUDA kernels for {', '.join(missing)} yet (the GPU "
                         f"runs {', '.join(have) or 'nothing yet'}); tune it on the CPU (--device cpu)")
    status = cuda_backend.status()
    if not status["available"]:
        raise ValueError(f"autotune --device cuda: cannot tune on the GPU: {status['reason']}")


def _check_plot(path: str) -> None:
    """ValueError naming --plot where the roofline could not be written to path (checked before tuning):
    no matplotlib, a file type matplotlib does not write, or a directory that does not exist."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise ValueError("autotune --plot: needs matplotlib (pip install 'dnnkit[plot]')") from None
    kinds = FigureCanvasAgg.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in kinds:
        raise ValueError(f"autotune --plot: cannot write {path!r}: the file name must end in one of "
                         f"{', '.join('.' + k for k in sorted(kinds))}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"autotune --plot: cannot write {path!r}: no directory {parent}")


def _picks(result):
    """(what tuning 'off' runs: the registry's first usable algorithm that its rule takes, the cost model's
    pick)."""
    from . import algos

    usable = {r.algorithm: r for r in result if r.status in ("ok", "inaccurate", "failed", "pruned")}
    problem = result.problem
    order = [a for a in algos.algorithms(problem.op, "cuda" if problem.device == "cuda" else "cpu")
             if a.name in usable]
    if not order:
        return None, None
    default = usable[next((a for a in order if a.rule(problem) is None), order[0]).name]
    predicted = [(usable[a.name].predicted_s, i, usable[a.name]) for i, a in enumerate(order)
                 if usable[a.name].predicted_s]
    # No prediction (GEMM's algorithms have no formula): the model made no pick of its own to score.
    heuristic = min(predicted, key=lambda t: (t[0], t[1]))[2] if predicted else None
    return default, heuristic


def summarize(results) -> dict:
    """Totals over tuned problems: time spent, speed-up over the untuned default, the cost model's record."""
    tuned = [r for r in results if r.best is not None]
    default_s = best_s = 0.0
    compared = within = 0
    errors = []
    for res in tuned:
        default, heuristic = _picks(res)
        if default is not None and default.ok:
            default_s += default.median_s
            best_s += res.best.median_s
        if heuristic is not None and heuristic.ok:
            compared += 1
            within += heuristic.median_s <= 1.10 * res.best.median_s
        errors += [abs(r.predicted_s - r.median_s) / r.median_s for r in res if r.ok and r.predicted_s]
    return {
        "problems": len(results),
        "tuned": len(tuned),
        "measured": sum(r.source == "measured" for r in results),
        "from_cache": sum(r.source == "cache" for r in results),
        "tuning_s": round(sum(r.elapsed_s for r in results if r.source == "measured"), 3),
        "speedup_over_default": round(default_s / best_s, 3) if best_s > 0 else None,
        "heuristic_within_10pct": within,
        "heuristic_compared": compared,
        "model_median_error": round(statistics.median(errors), 3) if errors else None,
    }


class _Progress:
    """A progress bar on stderr over a batch of problems (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.tty = total, enabled and total > 1, sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def step(self, i: int, label: str) -> None:
        if not self.enabled:
            return
        width = 24
        done = width * i // self.total
        line = f"[{'#' * done}{'.' * (width - done)}] {i}/{self.total} {time.perf_counter() - self.t0:5.1f} s  {label}"
        if self.tty:
            sys.stderr.write("\r" + line[:118].ljust(118))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r" + " " * 118 + "\r")
            sys.stderr.flush()


def _tuned_under_tighter_limit(result, limit: int | None) -> bool:
    """Whether result left a candidate untimed (over its limit) that fits `limit` (None: no limit)."""
    return any(r.status == "over_limit" and (limit is None or (r.workspace_bytes or 0) <= limit) for r in result)


def _cmd_autotune(args) -> int:
    from ._version import __version__
    from ._config import get_workspace_limit
    from .autotune.records import format_table
    from .autotune import cache
    from .autotune.cost_model import measure_ceilings, measure_gpu_ceilings, plausible_peak
    from .autotune.tuner import find

    problems = _problems(args)
    _check_gpu(problems)
    if args.plot:
        _check_plot(args.plot)
    limit = get_workspace_limit() if args.workspace_limit is None else args.workspace_limit
    store = _store()
    if not args.json:
        print(f"dnnkit {__version__} autotune: {len(problems)} problem(s) on {cache.device_fingerprint()}; "
              f"cache {store.path}")
    stored = store.get_ceilings()
    if stored is None or not plausible_peak(stored["peak_flops"]) or args.force:
        measure_ceilings(store)
    if any(p.device == "cuda" for p in problems) and (
            args.force or store.get_ceilings(cache.device_fingerprint("cuda")) is None):
        measure_gpu_ceilings(store)
    results = []
    progress = _Progress(len(problems), not args.json)
    for i, p in enumerate(problems):
        progress.step(i, f"{p.op} {p.descriptor()}")
        result = None if args.force else store.get(p)
        if result is not None and (_tuned_under_tighter_limit(result, limit)
                                   or args.no_prune and any(r.status == "pruned" for r in result)):
            result = None  # a candidate it left untimed is to be timed now: tune again
        if result is None:
            result = find(p, budget=args.budget, workspace_limit=args.workspace_limit,
                          prune=None if args.no_prune else 4.0, store=store)
        results.append(result)
        if not args.json:
            progress.close()
            print(format_table(result, limit), flush=True)
    progress.close()
    summary = summarize(results)
    chosen = [r.fastest(limit) for r in results]  # what dispatch takes under the limit
    if args.plot:
        _plot(results, args.plot, store.get_ceilings())
    if args.json:
        print(json.dumps({
            "version": __version__, "device": cache.device_fingerprint(), "cache": store.path,
            "problems": [{"problem": cache.problem_key(r.problem), "op": r.problem.op,
                          "descriptor": r.problem.descriptor(), "source": r.source,
                          "elapsed_s": r.elapsed_s, "best": b.algorithm if b else None,
                          "records": [x.to_dict() for x in r]} for r, b in zip(results, chosen)],
            "summary": summary,
        }, indent=1))
    else:
        s = summary
        print(f"\ntuned {s['tuned']} of {s['problems']} problem(s): {s['measured']} measured in {s['tuning_s']:.1f} s, "
              f"{s['from_cache']} from the cache")
        if s["speedup_over_default"]:
            print(f"chosen algorithms vs the registry's first (tuning off): {s['speedup_over_default']:.2f}x "
                  f"total time")
        if s["heuristic_compared"]:
            err = "" if s["model_median_error"] is None else f"; median prediction error {s['model_median_error']:.0%}"
            print(f"cost model (heuristic mode): within 10% of the best on {s['heuristic_within_10pct']} of "
                  f"{s['heuristic_compared']}{err}")
        if args.plot:
            print(f"roofline written to {args.plot}")
    untuned = [f"{r.problem.op} {r.problem.descriptor()} ({_why_untuned(r, limit)})"
               for r, b in zip(results, chosen) if b is None]
    if untuned and len(untuned) == len(results):
        raise ValueError(f"autotune: nothing could be tuned: {'; '.join(untuned)}")
    for line in untuned:
        print(f"dnnkit: autotune: not tuned: {line}", file=sys.stderr)
    return 1 if untuned else 0


def _why_untuned(result, limit) -> str:
    """Why result has no algorithm to choose (within limit): the first failure, else the first record's
    status and reason."""
    if any(r.ok for r in result):
        return f"every accurate algorithm needs more workspace than the limit of {limit} bytes"
    r = next((r for r in result if r.status == "failed"), result[0] if len(result) else None)
    if r is None:
        return "no algorithm"
    return f"{r.algorithm}: {r.status}" + (f": {r.reason}" if r.reason else "")


def _problem_bytes(p) -> int:
    """The least memory traffic of a problem: its inputs and outputs, once each.

    GEMM: A, B and C. Convolution: input, weight and output (whatever the direction; a backward reads two
    of them and writes the third). RNN: the input x (T*B*I), every layer's and direction's weights (W_ih,
    W_hh, the two biases unless nobias, an LSTM's projection W_hr where proj > 0), the output (T*B*D*S, S
    the state size: proj, or hidden without one) and the final states (h_n, and an LSTM's c_n); the
    initial states are left out (a call may leave them zero). A backward RNN moves twice that: it reads
    each of these (or its gradient) and writes the gradient of each."""
    from .problem import RnnProblem

    if isinstance(p, RnnProblem):
        g, h, s, d = p.gates, p.hidden, p.state, p.dirs
        weights = 0
        for layer in range(p.layers):
            inp = p.input if layer == 0 else d * s
            weights += d * (g * h * (inp + s) + (2 * g * h if p.bias else 0) + (s * h if p.proj else 0))
        states = p.layers * d * p.batch * (s + (h if p.mode == "lstm" else 0))
        total = p.seq * p.batch * p.input + weights + p.seq * p.batch * d * s + states
        return total * p.itemsize * (2 if p.direction == "bwd" else 1)
    if p.op == "gemm":
        return (p.m * p.k + p.k * p.n + p.m * p.n) * p.itemsize
    x, w, y = (math.prod(s) for s in (p.input_shape, p.weight_shape, p.output_shape))
    return (x + w + y) * p.itemsize


def _plot(results, path: str, ceilings) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("autotune: --plot needs matplotlib (pip install 'dnnkit[plot]')") from None
    from .autotune.cost_model import nominal_copy_bytes_per_s, nominal_peak_flops
    from ._config import get_num_threads

    peak = (ceilings or {}).get("peak_flops") or nominal_peak_flops()
    bw = ((ceilings or {}).get("copy_bytes_per_s") or nominal_copy_bytes_per_s()) * get_num_threads()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    points = {}
    for res in results:
        ai = res.problem.flops / max(1, _problem_bytes(res.problem))
        for r in res:
            if r.ok and r.gflops:
                points.setdefault(r.algorithm, []).append((ai, r.gflops))
    xs = [x for pts in points.values() for x, _ in pts] or [1.0]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, bw * x) / 1e9 for x in grid], "k-", lw=1.5,
            label=f"roofline: {peak / 1e9:.0f} GFLOP/s, {bw / 1e9:.0f} GB/s")
    for name, pts in sorted(points.items()):
        ax.scatter([x for x, _ in pts], [y for _, y in pts], s=18, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of inputs and outputs)")
    ax.set_ylabel("GFLOP/s (direct-convolution, GEMM and RNN-GEMM FLOPs)")
    ax.set_title("dnnkit autotune: measured algorithms against this machine's ceilings")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as e:
        raise ValueError(f"autotune: cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------------ cache
def _cmd_cache(args) -> int:
    from .autotune import cache
    from .autotune.records import format_table

    # show takes a key's words unquoted as well as quoted; every other argument is one word.
    words = args.arg or []
    if len(words) > 1 and args.action != "show":
        raise ValueError(f"cache {args.action}: takes one argument, got {len(words)}: {' '.join(words)!r} (quote "
                         f"one that holds spaces)")
    args.arg = " ".join(words) or None
    if args.action == "path":
        print(cache.cache_path())  # (opens nothing)
        return 0
    store = _store()
    if args.action == "clear":
        if bool(args.arg) == bool(args.all):
            raise ValueError("cache clear: give a pattern (text the problem keys contain, as `dnnkit cache list` "
                             "shows them) or --all, not both")
        device = None if args.all or args.device == "any" else cache.device_fingerprint()
        doomed = [r for r in store.rows() if args.all or (args.arg in r["problem"] and device in (None, r["device"]))]
        what = "every record and ceiling" if args.all else f"{len(doomed)} record(s) matching {args.arg!r}" + (
            f" on {device}" if device else "")
        if not doomed and not args.all:
            print(f"no tuning results match {args.arg!r}" + (f" on {device}" if device else ""))
            return 0
        if not args.yes and sys.stdin.isatty():
            if input(f"remove {what} from {store.path}? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing removed")
                return 1
        n = store.clear() if args.all else store.clear(pattern=args.arg, device=device)
        print(f"removed {n} tuning result(s) from {store.path}")
        return 0
    if args.action == "list":
        rows = store.rows()
        here = cache.device_fingerprint()
        from ._version import __version__

        if args.json:
            print(json.dumps([{k: v for k, v in r.items() if k != "records"} for r in rows], indent=1))
            return 0
        if not rows:
            print(f"no tuning results in {store.path}")
            return 0
        print(f"{len(rows)} tuning result(s) in {store.path} ('*': usable here: {here}, version {__version__})")
        for r in rows:
            mark = "*" if r["device"] == here and r["version"] == __version__ else " "
            best = f"{r['best']} {r['best_s'] * 1e3:.3f} ms" if r["best"] else "(no accurate algorithm)"
            print(f"{mark} {r['problem']:<72} {best:<32} {r['device']} v{r['version']}")
        return 0
    if args.action == "show":
        if not args.arg:
            raise ValueError("cache show: give a problem descriptor, or a key as `dnnkit cache list` prints it")
        p = _shown_problem(args.arg, args.direction, args.dtype)
        result = store.get(p)
        if result is None:
            print(f"dnnkit: no tuning result for {cache.problem_key(p)} on this device and version"
                  f"{_other_results(store, p)}", file=sys.stderr)
            return 1
        print(format_table(result))
        return 0
    if not args.arg:
        raise ValueError(f"cache {args.action}: give a file name")
    if args.action == "export":
        _check_export_target(args.arg, str(cache.cache_path()))
        rows = store.rows()
        try:
            with open(args.arg, "w", encoding="utf-8") as f:
                json.dump({"format": "dnnkit-tuning-cache", "schema": cache.SCHEMA_VERSION, "results": rows}, f,
                          indent=1)
        except OSError as e:
            raise ValueError(f"cache export: cannot write {args.arg}: {e.strerror or e}") from None
        print(f"exported {len(rows)} tuning result(s) to {args.arg}")
        return 0
    try:
        with open(args.arg, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ValueError(f"cache import: cannot read {args.arg}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"cache import: {args.arg} is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != "dnnkit-tuning-cache" or not isinstance(doc.get("results"), list):
        raise ValueError(f"cache import: {args.arg} is not a file written by 'dnnkit cache export'")
    if doc.get("schema") != cache.SCHEMA_VERSION:
        raise ValueError(f"cache import: {args.arg} has schema {doc.get('schema')}, this dnnkit reads "
                         f"{cache.SCHEMA_VERSION}")
    n = store.import_rows(doc["results"])
    print(f"imported {n} of {len(doc['results'])} tuning result(s) into {store.path} (newer ones kept)")
    return 0


def _shown_problem(text: str, direction: str | None, dtype: str | None):
    """The problem `cache show` is asked for: a key as `dnnkit cache list` prints it (its '*' mark optional;
    the operator gives the direction; after a convolution's or RNN's descriptor its dtype, 'bias' and device
    words where given, and the rest of the line ignored; --direction and --dtype, where given, must agree),
    else a descriptor with --direction and --dtype."""
    from .problem import CONV_DIRECTIONS, RNN_DIRECTIONS, RNN_MODES, parse_descriptor

    words = text.split()
    words = words[1:] if words[:1] == ["*"] else words
    ops = {"gemm"} | {f"conv2d_{d}" for d in CONV_DIRECTIONS} | {f"{m}_{d}" for m in RNN_MODES for d in RNN_DIRECTIONS}
    if not (words[:1] and words[0] in ops):
        _check_direction("cache show", text, direction)
        try:
            return parse_descriptor(text, direction=direction or "fwd", dtype=dtype or "float32")
        except ValueError as e:
            raise ValueError(f"cache show: {e}") from None
    op, rest = words[0], words[2:] if words[0] != "gemm" else []  # a GEMM key: its operator and descriptor
    own_dtype = rest.pop(0) if rest[:1] in (["float32"], ["float64"]) else None
    bias = rest[:1] == ["bias"] and bool(rest.pop(0))
    device = rest.pop(0) if rest[:1] in (["cpu"], ["cuda"]) else "cpu"
    own_direction = "fwd" if op == "gemm" else op.removeprefix("conv2d_") if op.startswith("conv2d_") \
        else op.rpartition("_")[2]
    p = None
    if len(words) > 1:
        try:
            p = parse_descriptor(words[1], direction=own_direction, dtype=own_dtype or dtype or "float32", bias=bias,
                                 device=device)
        except ValueError:
            pass
    if p is None or p.op != op:
        raise ValueError(f"cache show: {' '.join(words)!r} is not a key as `dnnkit cache list` prints one (its "
                         f"operator, then that operator's descriptor: 'gemm m64n64k64_f32', 'lstm_fwd "
                         f"lstm_l1t2mb2slc4sic4_f32 float32 bias cpu')")
    for flag, given, own in (("--direction", direction, own_direction), ("--dtype", dtype, p.dtype)):
        if given is not None and given != own:
            raise ValueError(f"cache show: {flag} {given} disagrees with the key {' '.join(words)!r}")
    return p


def _other_results(store, p) -> str:
    """'; the cache has ...': the stored results of p's descriptor in another direction or dtype (and a
    convolution's with or without bias), and p's for another device or version; '' where there are none."""
    from ._version import __version__
    from .autotune import cache
    from .problem import ConvProblem

    def loose(q):  # q but for its direction, dtype and (a convolution's) bias and name
        fields = {"dtype": "float32", **({"direction": "fwd"} if hasattr(q, "direction") else {}),
                  **({"bias": False, "name": ""} if isinstance(q, ConvProblem) else {})}
        return dataclasses.replace(q, **fields)

    want, here, found = loose(p), cache.device_fingerprint(p.device), []
    for row in store.rows():
        try:
            q = cache.parse_problem_key(row["problem"])
        except ValueError:
            continue
        if type(q) is type(p) and loose(q) == want:
            usable = row["device"] == here and row["version"] == __version__
            entry = repr(row["problem"]) + ("" if usable else " (another device or version)")
            found += [entry] if entry not in found else []
    return f"; the cache has {', '.join(found)}" if found else ""


def _check_export_target(path: str, live: str) -> None:
    """ValueError where exporting to path would overwrite the live store or one of its journal files (the
    name, existing or not, or another name of the same file), or any SQLite database or write-ahead log:
    JSON over it would destroy its records."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        same = os.path.realpath(path) == os.path.realpath(live + suffix)
        try:
            same = same or os.path.samefile(path, live + suffix)
        except OSError:
            pass
        if same:
            what = f"the live tuning cache's {suffix[1:]} file" if suffix else "the live tuning cache"
            raise ValueError(f"cache export: {path} is {what}; refusing to overwrite it (give a new file name, "
                             "e.g. tuning.json)")
    if os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                head = f.read(16)
        except OSError:
            return  # the write reports what is wrong with it
        if head.startswith(b"SQLite format 3\x00") or head[:4] in (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83"):
            raise ValueError(f"cache export: {path} is an SQLite database; refusing to overwrite it (give a new "
                             "file name, e.g. tuning.json)")


# ----------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dnnkit", description="dnnkit: deep-learning operator kernels and their autotuner")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p_info = sub.add_parser("info", help="backend, ISA, micro-kernels, threads, version")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_info.add_argument("--peak", action="store_true", help="also measure the float32 FMA peak")
    p_info.set_defaults(func=_cmd_info)

    p_explain = sub.add_parser("explain", help="candidate algorithms for a problem descriptor")
    p_explain.add_argument("problem", help='a GEMM ("m64n4096k4096tb_f32"), RNN ("lstm_l1t50mb16slc512sic512") '
                           'or benchdnn convolution ("mb8ic64ih56oc64oh56kh3ph1") descriptor')
    p_explain.add_argument("--direction", choices=("fwd", "bwd_data", "bwd_filter", "bwd"),
                           help="convolution direction, or bwd for an RNN")
    p_explain.add_argument("--dtype", choices=("float32", "float64"), help="convolution dtype")
    p_explain.set_defaults(func=_cmd_explain)

    p_tune = sub.add_parser(
        "autotune", help="time every algorithm on problems, keep the fastest accurate one in the cache",
        description="Time every algorithm that supports each problem on this machine, check its accuracy "
                    "and keep the fastest accurate one in the tuning cache. Problems already in the cache "
                    "for this device and version are shown from it (--force re-tunes).")
    p_tune.add_argument("op", nargs="?", choices=("conv2d",), help="tune one convolution given by shapes")
    p_tune.add_argument("--input", type=_ints_arg(4), metavar="N,C,H,W", help="conv2d input shape")
    p_tune.add_argument("--weight", type=_ints_arg(4), metavar="K,C,R,S", help="conv2d weight shape")
    p_tune.add_argument("--stride", type=_pair_arg, default=1, metavar="S[,S]")
    p_tune.add_argument("--padding", type=_padding_arg, default=0, metavar="P[,P]|same|valid")
    p_tune.add_argument("--dilation", type=_pair_arg, default=1, metavar="D[,D]")
    p_tune.add_argument("--groups", type=int, default=1)
    p_tune.add_argument("--problem", action="append", metavar="DESCRIPTOR",
                        help="a GEMM, RNN or benchdnn convolution descriptor (repeatable)")
    p_tune.add_argument("--batch", metavar="FILE", help="a file of descriptors, one a line")
    p_tune.add_argument("--model", choices=("resnet50", "lstm", "fc"), help="a layer list shipped with dnnkit")
    p_tune.add_argument("--mb", type=int, default=None, help="minibatch for --model (default 8)")
    p_tune.add_argument("--direction", choices=("fwd", "bwd_data", "bwd_filter", "bwd"), default="fwd",
                        help="convolution direction, or bwd for an RNN's backward (default fwd)")
    p_tune.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p_tune.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p_tune.add_argument("--budget", type=_budget_arg, default=None, metavar="SECONDS",
                        help="timing budget per problem, shared by its candidates (default 1.0)")
    p_tune.add_argument("--workspace-limit", type=_bytes_arg, default=None, metavar="BYTES",
                        help="do not run algorithms needing more workspace (e.g. 64M)")
    p_tune.add_argument("--force", action="store_true", help="re-tune problems already in the cache")
    p_tune.add_argument("--no-prune", action="store_true", help="time even candidates the cost model rules out")
    p_tune.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p_tune.add_argument("--plot", metavar="FILE.png", help="write a roofline plot (needs matplotlib)")
    p_tune.set_defaults(func=_cmd_autotune)

    p_cache = sub.add_parser("cache", help="the tuning cache: path, list, show, clear, export, import")
    p_cache.add_argument("action", choices=("path", "list", "show", "clear", "export", "import"))
    p_cache.add_argument("arg", nargs="*", metavar="DESCRIPTOR|KEY|FILE|PATTERN",
                         help="show: a descriptor, or a key as `cache list` prints it (e.g. 'gemm m8n8k8_f32'); "
                              "export/import: a file; clear: text the problem keys contain")
    p_cache.add_argument("--all", action="store_true", help="clear: every record of every device and version")
    p_cache.add_argument("--device", choices=("here", "any"), default="here",
                         help="clear PATTERN: records of this device only (default), or of any")
    p_cache.add_argument("--yes", action="store_true", help="clear: do not ask")
    p_cache.add_argument("--direction", choices=("fwd", "bwd_data", "bwd_filter", "bwd"),
                         help="show DESCRIPTOR: convolution direction, or bwd for an RNN (default fwd; a key names "
                              "its own)")
    p_cache.add_argument("--dtype", choices=("float32", "float64"),
                         help="show DESCRIPTOR: dtype of a descriptor without its own (default float32)")
    p_cache.add_argument("--json", action="store_true", help="list: print JSON")
    p_cache.set_defaults(func=_cmd_cache)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .autotune.cache import CacheError

    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"dnnkit: error: {e}", file=sys.stderr)
        return 2
    except CacheError as e:
        command = args.command + (f" {args.action}" if args.command == "cache" else "")
        print(f"dnnkit: error: {command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dnnkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`dnnkit autotune ... | head`): stop quietly; nothing more reaches stdout.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    finally:
        while _STRICT_STORES:
            _STRICT_STORES.pop().strict = False


if __name__ == "__main__":
    sys.exit(main())
