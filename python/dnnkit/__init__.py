"""dnnkit: deep-learning operator kernels for Python (CPU: C++/OpenMP; GPU: Numba-CUDA), with an
autotuner. NumPy arrays in and out on the CPU."""
import os as _os

from ._version import __version__

from ._config import (
    empty_cache, get_allow_tf32, get_amx, get_nan_semantics, get_num_threads, get_tuning, get_workspace_limit,
    set_allow_tf32, set_amx, set_nan_semantics, set_num_threads, set_tuning, set_workspace_limit,
)
from .ops import (
    RnnReserve, conv2d, conv2d_backward_bias, conv2d_backward_data, conv2d_backward_filter, explain, gemm, gru,
    gru_backward, gru_cell, gru_cell_backward, linear, linear_backward, lstm, lstm_backward, lstm_cell,
    lstm_cell_backward, rnn, rnn_backward, rnn_cell_backward, rnn_relu_cell, rnn_tanh_cell,
)
from .packed import GpuPackedWeight, PackedWeight, pack_weight
from .problem import ConvProblem, GemmProblem, RnnProblem
from . import algos, backends, machine


def info(gpu: bool = True) -> dict:
    """What dnnkit runs on here: version, backends (each available or why not), the CPU's ISA levels,
    caches and micro-kernels, threads, and the GPU (gpu=False skips asking the CUDA driver)."""
    from .backends import cpu, cuda

    out = {"version": __version__, "backends": {"cpu": {"available": cpu.available(),
                                                        "reason": cpu.unavailable_reason()}}}
    if gpu:
        s = cuda.status()
        out["backends"]["cuda"] = {"available": s["available"], "reason": s["reason"],
                                   "kernels": sorted({a.op for a in algos.all_algorithms() if a.backend == "cuda"}),
                                   "devices": s["devices"], "driver": s["driver"]}
    if not cpu.available():
        return out
    out.update({
        "cpu": cpu.cpu_model_name(),
        # Instruction-set levels (ref < avx2 < avx512 < amx): what this CPU and OS run (CPUID, XGETBV), the
        # highest the loaded module has, DNNKIT_ISA's cap, the highest the kernels may use (the least of those),
        # and the vector ISA of the kernels now, in the module built for that level.
        **cpu.levels(),
        "isa_limit": _os.environ.get("DNNKIT_ISA") or None,
        "amx_available": cpu.amx_available(),  # AMX-BF16 tiles: float32 products split into bfloat16 parts
        "amx": get_amx(),
        **cpu.cache_sizes(),
        "fma_datapath_bits": cpu.fma_datapath_bits(),  # a wider FMA takes several passes (the nominal peak)
        "openmp": cpu.has_openmp(),
        "threads": get_num_threads(),
        # How idle OpenMP threads wait (the environment's, read when the runtime loaded): see the README on
        # calling dnnkit between NumPy's BLAS calls.
        "omp_wait_policy": _os.environ.get("OMP_WAIT_POLICY"),
        "ukernels": machine.ukernels(),
        "tuning": get_tuning(),
        "nan_semantics": get_nan_semantics(),
        "workspace_limit": get_workspace_limit(),
        "block_cache_bytes": cpu.block_cache_bytes(),
    })
    return out


__all__ = [
    "__version__", "gemm", "linear", "linear_backward", "conv2d", "conv2d_backward_data", "conv2d_backward_filter",
    "conv2d_backward_bias", "explain", "info", "GemmProblem", "ConvProblem", "RnnProblem", "algos", "machine",
    "set_num_threads", "get_num_threads", "set_tuning", "get_tuning", "set_workspace_limit", "set_nan_semantics",
    "get_nan_semantics", "set_allow_tf32", "get_allow_tf32",
    "get_workspace_limit", "lstm", "gru", "rnn", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "lstm_backward", "gru_backward", "rnn_backward", "lstm_cell_backward", "gru_cell_backward", "rnn_cell_backward",
    "RnnReserve", "empty_cache", "pack_weight", "PackedWeight", "GpuPackedWeight", "set_amx", "get_amx", "backends",
]
