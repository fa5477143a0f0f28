"""What the GPU's ceilings are measured with (backends/cuda.py measure_ceilings): a kernel that does
nothing but fused multiply-adds from registers, so that its rate is the SMs' FMA peak at the clock they
sustain.

fma_peak: each thread runs n rounds of CHAINS independent chains x_i = x_i * a + b (CHAINS in flight hide
the FMA latency), then writes their sum to out[thread], so no round can be left out. 2 * CHAINS * n FLOP
a thread.
"""
from __future__ import annotations

import functools

from ._jit import DTYPES, cuda, int32, kernel

THREADS = 256
CHAINS = 8
UNROLL = 4   # rounds written out a loop trip


@functools.lru_cache(maxsize=None)
def fma_peak(dtype: str):
    """kernel(out, n, a, b): n rounds (a multiple of UNROLL) of CHAINS chained FMAs a thread; out has a
    slot per thread of the grid. Launch: any grid of THREADS-thread blocks."""
    t = DTYPES[dtype]
    name = f"fma_peak_{dtype}"
    body = ["i = int32(cuda.blockIdx.x) * int32(THREADS) + int32(cuda.threadIdx.x)",
            "v = t(i)"]
    body += [f"x{c} = v + t({c})" for c in range(CHAINS)]
    body += [f"for r in range(int32(0), int32(n), int32({UNROLL})):"]
    body += [f"    x{c} = cuda.fma(x{c}, a, b)" for _ in range(UNROLL) for c in range(CHAINS)]
    body += ["out[i] = " + " + ".join(f"x{c}" for c in range(CHAINS))]
    src = f"def {name}(out, n, a, b):\n" + "\n".join("    " + x for x in body) + "\n"
    scope = {"cuda": cuda, "int32": int32, "t": t, "THREADS": THREADS}
    exec(compile(src, f"<dnnkit.kernels.probe:{name}>", "exec"), scope)  # noqa: S102 - generated from integers
    return kernel(scope[name], launch_bounds=(THREADS,))
