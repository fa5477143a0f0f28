"""What this machine can do: ISA, micro-kernels, and measured ceilings (the FMA peak) that benchmarks
and the cost model compare against."""
from __future__ import annotations

import functools

from .backends import cpu as _cpu
from ._config import get_num_threads


def isa() -> str:
    """The instruction set the CPU kernels use now: 'avx512', 'avx2' or 'ref'."""
    return _cpu.active_isa()


@functools.lru_cache(maxsize=None)
def _peak(isa_name: str, nthreads: int, seconds: float) -> float:
    return _cpu.measure_peak_flops(nthreads, seconds, isa_name) / 1e9


def peak_gflops(nthreads: int | None = None, *, isa_name: str | None = None, seconds: float = 0.2) -> float:
    """Measured float32 FMA throughput in GFLOP/s on `nthreads` threads (default: dnnkit's thread count),
    for the widest ISA this CPU has unless `isa_name` says otherwise. Measured once per process."""
    nt = get_num_threads() if nthreads is None else int(nthreads)
    return _peak(isa_name or _cpu.detected_isa(), nt, float(seconds))


def ukernels() -> dict:
    """Micro-kernel and blocking per dtype for the active ISA."""
    out = {}
    for dtype, size in (("float32", 4), ("float64", 8)):
        name, mr, nr, mc, kc, nc = _cpu.ukernel_info(isa(), size)
        # The strided-A tiles, narrowest first: a batch takes the narrowest that holds it (a larger one
        # runs as panels of one of them).
        tiles, rows = [], 1
        while True:
            sa_name, _, sa_nr = _cpu.sa_kernel_info(isa(), size, rows)
            if sa_nr < rows or sa_name in tiles:
                break
            tiles.append(sa_name)
            rows = sa_nr + 1
        out[dtype] = {"ukernel": name, "MR": mr, "NR": nr, "MC": mc, "KC": kc, "NC": nc,
                      "strided_a": ", ".join(tiles) if tiles else "none"}
    return out
