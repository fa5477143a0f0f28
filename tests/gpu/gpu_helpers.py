"""Shared by the GPU tests: device arrays from NumPy and back, and the float64 oracle's bound."""
from __future__ import annotations

import numpy as np

from dnnkit import reference as ref


def dev(x):
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(x))


def host(d) -> np.ndarray:
    return d.copy_to_host()


def tol(dtype) -> float:
    return 2e-6 if np.dtype(dtype) == np.float32 else 1e-13


def close(actual, expected, dtype) -> bool:
    return ref.rel_l2(actual, expected) <= tol(dtype)


def rand(rng, shape, dtype=np.float32):
    return rng.uniform(-1, 1, size=shape).astype(dtype)
