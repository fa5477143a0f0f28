"""The CUDA backend: device arrays (anything with __cuda_array_interface__, or CUDA DLPack), Numba-CUDA
kernels (dnnkit.kernels), CUDA events for timing, the GPU's fingerprint.

Nothing here imports numba or CuPy until asked: `import dnnkit` stays as fast with them installed as
without, and works where they are not."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def status() -> dict:
    """Whether a CUDA GPU can run dnnkit's GPU kernels here, and why not: {"available": bool, "reason":
    str | None, "devices": [{"name", "compute_capability", "memory_bytes", "sm_count"}], "driver": str}.
    Asks once per process (importing numba-cuda and initialising the driver)."""
    try:
        from numba import cuda
    except Exception as e:  # noqa: BLE001 - numba-cuda missing or broken: the GPU path is unavailable
        return {"available": False, "reason": f"numba-cuda is not installed ({type(e).__name__}: {e}); "
                                              f"pip install \"dnnkit[cuda]\"", "devices": [], "driver": None}
    try:
        if not cuda.is_available():
            return {"available": False, "reason": "no CUDA driver or GPU found", "devices": [], "driver": None}
        devices = []
        for d in cuda.list_devices():
            with d:
                dev = cuda.get_current_device()
                name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                free, total = cuda.current_context().get_memory_info()
                devices.append({"name": name, "compute_capability": "%d.%d" % dev.compute_capability,
                                "memory_bytes": int(total), "sm_count": int(dev.MULTIPROCESSOR_COUNT)})
        ver = cuda.cudadrv.driver.driver.get_version()
        return {"available": True, "reason": None, "devices": devices, "driver": ".".join(map(str, ver))}
    except Exception as e:  # noqa: BLE001 - a driver that fails to initialise: the GPU path is unavailable
        return {"available": False, "reason": f"the CUDA driver failed ({type(e).__name__}: {e})", "devices": [],
                "driver": None}


def fingerprint() -> str:
    """What a GPU tuning record is valid for: the device's name, compute capability, SM count and the
    driver; 'cuda|unavailable' (matching no record) without a usable GPU."""
    s = status()
    if not s["available"] or not s["devices"]:
        return "cuda|unavailable"
    d = s["devices"][0]
    return f"cuda|{d['name']}|sm{d['compute_capability']}|{d['sm_count']}sm|driver{s['driver']}"


def no_kernels(op: str) -> Exception:
    """The error for op called with GPU arrays: dnnkit has no GPU algorithm for it (yet), or no GPU here."""
    from .. import algos

    if algos.algorithms(_registry_op(op), "cuda"):
        s = status()
        if not s["available"]:
            return RuntimeError(f"{op}: GPU arrays given but the GPU backend is unavailable: {s['reason']}")
        return NotImplementedError(f"{op}: the GPU backend does not take these arrays yet")
    return NotImplementedError(f"{op}: GPU arrays given, and dnnkit has no GPU kernels for this operator yet; "
                               f"pass NumPy arrays to run it on the CPU")


def _registry_op(op: str) -> str:
    """The registry's operator name for a public function's name."""
    return {"linear": "gemm", "linear_backward": "gemm", "conv2d": "conv2d_fwd",
            "conv2d_backward_data": "conv2d_bwd_data", "conv2d_backward_filter": "conv2d_bwd_filter"}.get(op, op)
