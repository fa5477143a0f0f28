"""What differs between compiling a kernel for a GPU and running it in Numba's CUDA simulator.

Every kernel module takes `cuda` and its decorators from here. Under the simulator
(NUMBA_ENABLE_CUDASIM=1) the options that only the compiler understands (launch bounds, line info) are
dropped; on a GPU and for code generation (compile_ptx) they are passed through.
"""
from __future__ import annotations

import math

import numba
from numba import cuda

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)

# The dtypes the kernels are written for, by NumPy name.
DTYPES = {"float32": numba.float32, "float64": numba.float64}
# The keyword that aligns a shared array to 16 bytes, so that 128-bit loads of it can be proven aligned;
# in source generated for a kernel. The simulator takes no alignment.
ALIGN16 = "" if SIMULATOR else ", alignment=16"
int32 = numba.int32
uint32 = numba.uint32
uint64 = numba.uint64


def kernel(fn=None, **options):
    """cuda.jit for a kernel; options a simulator does not take are dropped there."""
    if SIMULATOR:
        options = {k: v for k, v in options.items() if k not in ("launch_bounds", "lineinfo", "fastmath")}
    if fn is None:
        return lambda f: cuda.jit(**options)(f)
    return cuda.jit(**options)(fn)


def device(fn):
    """cuda.jit for a device function, inlined into its callers."""
    return cuda.jit(device=True, inline=True)(fn) if not SIMULATOR else cuda.jit(device=True)(fn)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["SIMULATOR", "ALIGN16", "DTYPES", "cuda", "int32", "uint32", "uint64", "kernel", "device", "cdiv", "math"]
