"""The CPU backend: the C++ kernel module for this CPU (dnnkit._cpu, chosen by _extension.py), host
arrays (NumPy), host memory, wall-clock timing, and the machine's fingerprint and ceilings.

`ext` is the kernel module; algos/ call its kernels, everything else asks the functions here."""
from __future__ import annotations

import functools
import time

from .. import _extension

ext = _extension.cpu

name = "cpu"
timer = time.perf_counter  # the tuner's clock: the kernels return when their work is done


def available() -> bool:
    return _extension.error is None


def unavailable_reason() -> str | None:
    return _extension.error


def synchronize() -> None:
    """Nothing: a CPU kernel has finished when it returns."""


def time_call(fn) -> float:
    """Seconds fn() takes (the tuner's timer): a CPU call has finished when it returns."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# Memory. Float arrays of 128 KiB and up come from the kernels' block cache and go back to it when freed
# (csrc/block_cache.cpp): a fresh mapping from the allocator would fault in zeroed pages at every call.
empty = ext.empty          # empty(shape, itemsize) -> float32/float64 ndarray
# Bytes from which empty's and scratch's arrays come from the block cache; a smaller one is NumPy's own.
recycle_bytes = ext.RECYCLE_BYTES if _extension.error is None else 0
scratch = ext.scratch      # scratch(nbytes) -> uint8 ndarray from the block cache
block_cache_bytes = ext.block_cache_bytes
block_cache_release = ext.block_cache_release


def workspace(nbytes: int, itemsize: int):
    """An algorithm's workspace of nbytes as a 1-D float array of itemsize-byte elements (None for none),
    from empty: the operators and the tuner's calls take it here alike, so the tuner times what a call
    costs (a fresh mapping of several MiB would fault in its pages at every call)."""
    return None if nbytes == 0 else empty((nbytes // itemsize,), itemsize)

# Settings. settings_generation() changes whenever one of them does (a cached decision keyed by it is
# stale then).
set_num_threads = ext.set_num_threads  # 1 to MAX_THREADS, else ValueError
MAX_THREADS = ext.MAX_THREADS if _extension.error is None else 0
get_num_threads = ext.get_num_threads
set_amx = ext.set_amx
amx_enabled = ext.amx_enabled
amx_available = ext.amx_available
amx_takes_shape = ext.amx_takes_shape
# Without the kernel module (a GPU-only use of dnnkit) nothing changes the settings.
settings_generation = ext.settings_generation if _extension.error is None else (lambda: 0)

# The machine.
active_isa = ext.active_isa      # the kernels' vector ISA now: 'avx512', 'avx2' or 'ref'
detected_isa = ext.detected_isa  # the widest this CPU and OS run
cpu_model_name = functools.cache(ext.cpu_model_name)  # read once: the CPU does not change under a process
ukernel_info = ext.ukernel_info
sa_kernel_info = ext.sa_kernel_info
has_openmp = ext.has_openmp
fma_datapath_bits = ext.fma_datapath_bits


def levels() -> dict:
    """Instruction-set levels (ref < avx2 < avx512 < amx): what this CPU and OS run (CPUID, XGETBV), the
    highest the loaded module has, the highest the kernels may use, and the module's name."""
    return {"isa_detected": ext.cpu_level(), "isa_built": ext.built_level(), "isa_max": ext.max_level(),
            "isa_active": ext.active_isa(), "module": ext.__name__}


def cache_sizes() -> dict:
    """The data caches as the CPU reports them (CPUID); the GEMM's blocking is sized from them."""
    return {"l1d_cache_bytes": ext.l1d_cache_bytes(), "l2_cache_bytes": ext.l2_cache_bytes(),
            "l3_cache_bytes": ext.l3_cache_bytes()}


def last_level_cache_bytes() -> int:
    return max(int(ext.l3_cache_bytes()), int(ext.l2_cache_bytes()))


def fingerprint() -> str:
    """What a CPU tuning record is valid for: the CPU model, the kernels' ISA (float32 products on AMX tiles
    time differently from the FMA kernels: a device of its own) and the thread count."""
    isa = ext.active_isa()
    amx = "+amx" if ext.amx_enabled() and isa == "avx512" else ""
    return f"cpu|{cpu_model_name()}|{isa}{amx}|{ext.get_num_threads()}t"


# Ceilings: the vector width of each ISA's FMA kernels (the reference kernels: 4 float32 FLOP a cycle), two
# FMA pipes a core, at a nominal clock.
_VECTOR_BITS = {"avx512": 512, "avx2": 256}
_NOMINAL_GHZ = 2.5


def flops_per_cycle(isa: str) -> float:
    """float32 FLOP a core retires per cycle in isa's FMA kernels: two FMA pipes, each a vector of the
    ISA's width or of the core's FMA datapath where that is narrower (Zen and Zen+: 128 bits; Zen 4's
    AVX-512: 256)."""
    if isa not in _VECTOR_BITS:
        return 4.0
    return 2 * 2 * min(_VECTOR_BITS[isa], fma_datapath_bits()) / 32


def nominal_peak_flops() -> float:
    """float32 FLOP/s on dnnkit's threads from the active ISA's FMA throughput at a nominal clock."""
    return flops_per_cycle(ext.active_isa()) * _NOMINAL_GHZ * 1e9 * ext.get_num_threads()


# Bytes a second one thread copies (measure_copy_bandwidth), by the core's FMA datapath width, which tells
# core generations apart; 10 GB/s on any other width. Used until `dnnkit autotune` measures the
# machine's own rate (bench/RESULTS.md, the nominal copy rate a thread, in each CPU's section).
_NOMINAL_COPY = {128: 13e9, 256: 18e9, 512: 27e9}


def nominal_copy_bytes_per_s() -> float:
    """The per-thread copy bandwidth the cost model takes until it is measured (_NOMINAL_COPY)."""
    return _NOMINAL_COPY.get(fma_datapath_bits(), 10e9)


def measure_peak_flops(nthreads: int, seconds: float, isa: str | None = None) -> float:
    """Measured float32 FMA throughput (FLOP/s) on nthreads threads, for isa (default: the active one)."""
    return ext.measure_peak_gflops(isa or ext.active_isa(), nthreads, seconds) * 1e9


def measure_copy_bandwidth(repeats: int = 5) -> float:
    """Bytes a second one thread copies (read plus write) through a 32 MiB buffer, beyond any L2."""
    import numpy as np

    src = np.ones(8 << 20, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best
