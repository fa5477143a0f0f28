"""What the operators share: problems kept per call signature, plans with the public function's name in
their errors, the hand-off of GPU arrays to the GPU path, and the checks of accumulate_into targets."""
from __future__ import annotations

import numpy as np

from ..backends import device_of, placement_error
from ..dispatch import plan as _dispatch_plan
from ..plans import Memo


# Problems are immutable and built from a handful of ints, flags and names: keep one object per key (the
# operator's family first) so that a repeated call builds no dataclass and hashes to a cached plan.
_problems = Memo()

# Calls already validated and dispatched, by operator and call signature: the operator's name, then what its
# checks and its dispatch depend on (each argument's shape and dtype, the other arguments as the operator
# keys them, algo, dispatch_state()) -> what a repeated call needs to run (its plan, how to allocate its
# outputs). A hit skips the checks and the dispatch, most of a small call's time (bench/dispatch.py).
_calls = Memo(4096)


def _plan(op: str, p, algo, workspace_limit=None):
    """dispatch.plan, its errors naming the public function op (linear's problems are GEMM problems)."""
    try:
        return _dispatch_plan(p, algo, workspace_limit)
    except (TypeError, ValueError) as e:
        msg = str(e)
        if op == p.op or not msg.startswith(f"{p.op}: "):
            raise
        raise type(e)(f"{op}: {msg[len(p.op) + 2:]}") from None


def _gpu(op: str, **arrays):
    """The GPU path of the public functions (gpu_dense), for a call whose arrays are on the GPU; raises
    placement_error when they are mixed with host arrays in a way its checks would not name."""
    from . import gpu_dense

    where = {device_of(v) for v in arrays.values() if not isinstance(v, (list, tuple, dict))} - {None}
    if "cuda" not in where:
        raise placement_error(op, **arrays)
    return gpu_dense


def _host_stream(op: str, stream) -> None:
    if stream is not None:
        raise TypeError(f"{op}: stream is for GPU arrays; the arrays given are on the host")


def _targets_apart(op: str, targets, inputs) -> None:
    """A ValueError naming op and both arguments where an array a backward adds into (accumulate_into;
    targets: (label, array or None) pairs) shares memory with an array it reads (inputs: the same, a label
    also (name, index)) or with another target: the gradients would be computed from what they overwrite.
    Arrays whose memory two different NumPy arrays own cannot overlap; only the rest are compared."""
    by_owner: dict = {}  # id of the owning array (None: not a NumPy array) -> [(label, array)]
    for label, a in inputs:
        if isinstance(a, np.ndarray):
            key = id(a) if a.base is None else _owner_id(a)
            group = by_owner.get(key)
            if group is None:
                by_owner[key] = [(label, a)]
            else:
                group.append((label, a))
    for label, t in targets:
        if t is None:
            continue
        key = id(t) if t.base is None else _owner_id(t)
        near = by_owner.get(key, ())
        if None in by_owner or key is None:
            near = [*near, *(by_owner.get(None, ()) if key is not None else
                             [x for group in by_owner.values() for x in group])]
        for other, a in near:
            if np.may_share_memory(t, a):
                other = other if isinstance(other, str) else f"{other[0]} {other[1]}"
                raise ValueError(f"{op}: {label} shares memory with {other}; the gradients added to it are "
                                 f"computed from {other}, so they must be separate arrays")
        by_owner.setdefault(key, []).append((label, t))


def _owner_id(a: np.ndarray):
    """id of the NumPy array that owns a's memory, or None where something else does (a buffer, a mapping)."""
    base = a.base
    while base is not None:
        if type(base) is not np.ndarray and not isinstance(base, np.ndarray):
            return None
        a, base = base, base.base
    return id(a)


def _accumulate_target(op, name, a, shape, dtype) -> np.ndarray:
    """An array a backward adds a gradient of `shape` and `dtype` into (accumulate_into), checked."""
    shape = tuple(shape)
    if type(a) is not np.ndarray:
        raise TypeError(f"{op}: {name} must be a NumPy array of the gradient's shape {shape}, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {a.dtype} but the gradients are {dtype}")
    if a.shape != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {a.shape}")
    if not (a.flags.c_contiguous and a.flags.writeable):
        raise ValueError(f"{op}: {name} must be C-contiguous and writable (it is added to in place)")
    return a
