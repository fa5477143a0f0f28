"""The `dnnkit` command line (also `python -m dnnkit`)."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_info(args) -> int:
    import dnnkit

    info = dnnkit.info()
    if args.peak:
        info["peak_gflops_fp32"] = round(dnnkit.machine.peak_gflops(), 1)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "ukernels":
            for dtype, u in value.items():
                print(f"{'ukernel ' + dtype:<18} {u['ukernel']}  MC={u['MC']} KC={u['KC']} NC={u['NC']}")
        else:
            print(f"{key:<18} {value}")
    return 0


def _cmd_explain(args) -> int:
    import dnnkit

    kwargs = {}
    if args.direction or args.dtype:
        kwargs = {"direction": args.direction or "fwd", "dtype": args.dtype or "float32"}
    print(dnnkit.explain(args.problem, **kwargs))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dnnkit", description="dnnkit: deep-learning operator kernels")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_info = sub.add_parser("info", help="backend, ISA, micro-kernels, threads, version")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_info.add_argument("--peak", action="store_true", help="also measure the float32 FMA peak")
    p_info.set_defaults(func=_cmd_info)
    p_explain = sub.add_parser("explain", help="candidate algorithms for a problem descriptor")
    p_explain.add_argument("problem", help='a GEMM descriptor ("m64n4096k4096tb_f32") or a benchdnn '
                           'convolution descriptor ("mb8ic64ih56oc64oh56kh3ph1")')
    p_explain.add_argument("--direction", choices=("fwd", "bwd_data", "bwd_filter"), help="convolution direction")
    p_explain.add_argument("--dtype", choices=("float32", "float64"), help="convolution dtype")
    p_explain.set_defaults(func=_cmd_explain)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"dnnkit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
