"""What each GPU kernel variant compiles to, without a GPU: registers, shared and local memory, resident
blocks and occupancy per SM, and in the SASS of its main loop the fused multiply-adds' share and the
shared-memory load widths. One row per kernel and architecture.

  python bench/gpu_kernels.py [--arch sm_80 sm_90] [--csv out.csv]

Needs numba-cuda with its compiler (pip install "dnnkit[cuda]"); SASS columns need cuobjdump and nvdisasm
(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time

from dnnkit.kernels import codegen

ARCHS = {"sm_80": (8, 0), "sm_90": (9, 0)}


def rows(archs):
    have_sass = codegen.cuobjdump() is not None
    for v in codegen.variants():
        for arch in archs:
            t0 = time.perf_counter()
            r = codegen.link(codegen.compile_ptx(v, ARCHS[arch]), arch)
            row = {"kernel": v.name, "arch": arch, "threads": v.threads, "registers": r.registers,
                   "shared_B": r.shared_bytes, "local_B": r.local_bytes, "blocks_per_SM": r.blocks_per_sm(v.threads, arch),
                   "occupancy": round(r.occupancy(v.threads, arch), 3), "compile_s": round(time.perf_counter() - t0, 1)}
            if have_sass:
                prof = codegen.sass_profile(codegen.sass(r.cubin))
                row.update({"sass_insns": prof.instructions, "loop_insns": prof.loop_instructions,
                            "loop_fma": prof.loop_ffma, "loop_fma_share": round(prof.loop_ffma_share, 2),
                            "lds": " ".join(f"{k}:{n}" for k, n in sorted(prof.lds.items())) or "-",
                            "spill_insns": prof.local})
                if v.inner_loop_fma:  # the product loop (the persistent RNN's, inside its time loop)
                    row.update({"loop_insns": prof.inner_instructions, "loop_fma": prof.inner_ffma,
                                "loop_fma_share": round(prof.inner_ffma / max(prof.inner_instructions, 1), 2),
                                "lds": " ".join(f"{k}:{n}" for k, n in prof.inner_lds) or "-"})
            yield row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    ap.add_argument("--csv", help="also write the rows to this CSV file")
    args = ap.parse_args(argv)
    out = list(rows(args.arch))
    cols = list(out[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in out)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in out:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
