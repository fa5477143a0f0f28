"""Backends: what differs between running on the CPU and on a CUDA GPU.

A backend owns its arrays (recognising them, allocating them), its scratch memory, synchronization, the
timer the tuner uses, the fingerprint a tuning record is keyed by, and the ceilings (peak FLOP/s,
bandwidth) the cost model scales by. The operators above (ops/, dispatch, the tuner) ask
the backend; only backends/ and algos/ reach the kernel modules.

The backend of a call is the backend of its arrays: NumPy arrays (and anything NumPy converts, host
DLPack tensors included) run on the CPU; arrays with ``__cuda_array_interface__`` (CuPy, PyTorch CUDA
tensors, Numba device arrays) or a CUDA DLPack device run on the GPU. Both kinds in one call is an error
that names the arguments.
"""
from __future__ import annotations

from . import cpu, cuda

BACKENDS = {"cpu": cpu, "cuda": cuda}

_DL_CUDA = (2, 13)  # DLPack device types (dlpack.h DLDeviceType) of CUDA memory: kDLCUDA, kDLCUDAManaged


def device_of(x) -> str | None:
    """'cuda' for an array on a CUDA device, 'cpu' for a host array or anything NumPy may convert, None
    for None."""
    if x is None:
        return None
    if cuda.is_device_array(x):
        return "cuda"
    dl = getattr(x, "__dlpack_device__", None)
    if dl is not None and not hasattr(x, "__array__") and not hasattr(x, "__array_interface__"):
        try:
            if int(dl()[0]) in _DL_CUDA:
                return "cuda"
        except Exception:  # noqa: BLE001 - not a usable DLPack device: NumPy's conversion reports it
            pass
    return "cpu"


class DeviceArray(TypeError):
    """Raised inside argument checks on meeting a device array; the public function turns it into
    placement_error() with all of its arrays in view."""


def placement_error(op: str, **arrays) -> Exception:
    """The error for a call op(**arrays) that holds a device array: which arguments are on which device
    when they are mixed, else why the device's backend cannot run op."""
    where: dict[str, list[str]] = {}
    for name, x in arrays.items():
        if isinstance(x, (list, tuple)):
            for i, e in enumerate(x):
                d = device_of(e)
                if d is not None:
                    where.setdefault(d, []).append(f"{name}[{i}]")
        elif isinstance(x, dict):
            for k, e in x.items():
                d = device_of(e)
                if d is not None:
                    where.setdefault(d, []).append(f"{name}[{k!r}]")
        else:
            d = device_of(x)
            if d is not None:
                where.setdefault(d, []).append(name)
    if len(where) > 1:
        on = "; ".join(f"{', '.join(names)} on {'the GPU (CUDA)' if d == 'cuda' else 'the host'}"
                       for d, names in where.items())
        return TypeError(f"{op}: arrays on different devices ({on}); pass all of a call's arrays on one device")
    return cuda.no_kernels(op)
