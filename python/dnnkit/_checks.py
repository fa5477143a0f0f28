"""Argument checks shared by the public functions (ops/, packed.py): each error names the
operator and the argument. Host arrays pass through without a copy; a device array raises DeviceArray,
which the public function turns into backends.placement_error with all of its arguments in view."""
from __future__ import annotations

import numbers

import numpy as np

from .backends import DeviceArray, cpu as _cpu, device_of
from .problem import ACTIVATIONS, shown

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}


def _array(op: str, name: str, x, ndim=None) -> np.ndarray:
    """x as a float32/float64 ndarray (no copy for ndarrays), or a TypeError/ValueError naming op and name."""
    if type(x) is np.ndarray and x.dtype in _FLOAT_DTYPES and (ndim is None or x.ndim == ndim):
        return x  # the common case, checked first
    if x is None:
        raise TypeError(f"{op}: {name} must be an array, got None")
    if device_of(x) == "cuda":
        raise DeviceArray(f"{op}: {name} is an array on a CUDA device")  # the public function says more
    if type(x).__name__ in ("PackedWeight", "GpuPackedWeight"):
        raise TypeError(f"{op}: {name} is a packed weight (dnnkit.pack_weight), which linear and the cells take; "
                        f"pass its .weight here")
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as e:  # noqa: BLE001 - any conversion failure is the caller's bad input
            raise TypeError(f"{op}: {name} must be an array, got {type(x).__name__} ({e})") from None
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must have dtype float32 or float64, got {x.dtype}")
    if ndim is not None and x.ndim not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        want = " or ".join(f"{d}-D" for d in (ndim if isinstance(ndim, tuple) else (ndim,)))
        raise ValueError(f"{op}: {name} must be {want}, got shape {x.shape}")
    return x


def _new_problem(op: str, cls, *args, **kwargs):
    """cls(*args, **kwargs), its ValueError (a size over problem.MAX_SIZE) naming the public function op."""
    try:
        return cls(*args, **kwargs)
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from None


def _same_dtype(op: str, **arrays) -> np.dtype:
    named = [(k, v) for k, v in arrays.items() if v is not None]
    dtype = named[0][1].dtype
    for k, v in named[1:]:
        if v.dtype != dtype:
            raise TypeError(
                f"{op}: {k} has dtype {v.dtype} but {named[0][0]} has {dtype}; all arrays must share one dtype"
            )
    return dtype


def _scalar(op: str, name: str, v) -> float:
    if type(v) is float or type(v) is int:
        return float(v)  # the common case, checked first
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{op}: {name} must be a real number, got {type(v).__name__}")
    return float(v)


def _flag(op: str, name: str, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a bool, got {type(v).__name__}")
    return bool(v)


def _activation(op: str, activation) -> str:
    if activation is None:
        return "identity"
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None or one of {ACTIVATIONS}, got {shown(activation)}")
    return activation


def _linear_backward_shapes(op: str, x_shape, w_shape, gy_shape) -> tuple:
    """(out_features, in_features, the shape of grad_output and of a saved output) of linear_backward's
    input, weight and grad_output shapes, on either device; a ValueError naming the argument otherwise."""
    x_shape, w_shape, gy_shape = tuple(x_shape), tuple(w_shape), tuple(gy_shape)
    if len(x_shape) < 1:
        raise ValueError(f"{op}: input must have at least 1 dimension, got shape {x_shape}")
    out_f, in_f = w_shape
    if x_shape[-1] != in_f:
        raise ValueError(f"{op}: input has {x_shape[-1]} features but weight {w_shape} expects {in_f}")
    expect = x_shape[:-1] + (out_f,)
    if gy_shape != expect:
        raise ValueError(f"{op}: grad_output must have shape {expect}, got {gy_shape}")
    return out_f, in_f, expect


def _output(op: str, name: str, out, shape, dtype) -> np.ndarray:
    if device_of(out) == "cuda":
        raise DeviceArray(f"{op}: {name} is an array on a CUDA device")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{op}: {name} must be a NumPy array, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{op}: {name} must have dtype {dtype}, got {out.dtype}")
    if out.shape != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError(f"{op}: {name} is read-only")
    # A zero-size array may have zero strides (NumPy gives them all 0) without overlapping itself.
    if out.size > 0 and any(s == 0 and n > 1 for s, n in zip(out.strides, out.shape)):
        raise ValueError(f"{op}: {name} has a zero stride (a broadcast view); it must not overlap itself")
    return out


def _empty(op: str, shape, dtype) -> np.ndarray:
    """np.empty, with an output too large to allocate reported as a MemoryError naming op (NumPy raises
    ValueError rather than MemoryError when the byte count overflows). Float outputs of 128 KiB and up come
    from the kernels' block cache, as their scratch does, and go back to it when freed: from glibc, whether
    such an array faults in fresh pages at every call depends on what the process allocated before."""
    try:
        if dtype == np.float32 or dtype == np.float64:
            return _cpu.empty(shape, np.dtype(dtype).itemsize)
        return np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError, TypeError, OverflowError) as e:
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else shape
        raise MemoryError(f"{op}: cannot allocate an output of shape {shape} ({e})") from None


def _unshared(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """x, copied if it may overlap out (an output written while it is still being read)."""
    return x.copy() if np.may_share_memory(x, out) else x
