"""Operands and calls for timing an algorithm on a problem, per operator.

For every tunable op this module knows how to make random inputs of a problem's shapes (never zeros:
uniform in [-1, 1), so a kernel that skips work on zeros is not flattered), how to allocate the output
and the workspace, and how to call an Algorithm's run() the way the public API does. The autotuner
(tuner.py) is the only user; adding an operator to the tuner is one entry in _OPS.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..problem import ConvProblem, GemmProblem


@dataclasses.dataclass
class Operands:
    """The inputs of one call (in run()'s order), its keyword inputs, and the output's shape."""

    args: tuple
    kwargs: dict
    out_shape: tuple

    def astype(self, dtype) -> "Operands":
        conv = lambda a: a if a is None or not isinstance(a, np.ndarray) else _like(a, dtype)  # noqa: E731
        return Operands(tuple(conv(a) for a in self.args), {k: conv(v) for k, v in self.kwargs.items()},
                        self.out_shape)


def _like(a: np.ndarray, dtype) -> np.ndarray:
    """a converted to dtype with the same logical layout (a transposed view stays a transposed view)."""
    if a.ndim == 2 and not a.flags.c_contiguous and a.T.flags.c_contiguous:
        return np.ascontiguousarray(a.T, dtype=dtype).T
    return np.ascontiguousarray(a, dtype=dtype)


def _uniform(rng, shape, dtype) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def _gemm_operands(p: GemmProblem, rng) -> Operands:
    dt = np.dtype(p.dtype)
    a = _uniform(rng, (p.k, p.m) if p.trans_a else (p.m, p.k), dt)
    b = _uniform(rng, (p.n, p.k) if p.trans_b else (p.k, p.n), dt)
    A = a.T if p.trans_a else a
    B = b.T if p.trans_b else b
    kwargs = {"bias": _uniform(rng, (p.n,), dt)} if p.bias else {}
    return Operands((A, B), kwargs, (p.m, p.n))


def _conv_operands(p: ConvProblem, rng) -> Operands:
    dt = np.dtype(p.dtype)
    x_shape, w_shape, y_shape = p.input_shape, p.weight_shape, p.output_shape
    if p.direction == "fwd":
        kwargs = {"bias": _uniform(rng, (p.oc,), dt)} if p.bias else {}
        return Operands((_uniform(rng, x_shape, dt), _uniform(rng, w_shape, dt)), kwargs, y_shape)
    if p.direction == "bwd_data":
        return Operands((_uniform(rng, w_shape, dt), _uniform(rng, y_shape, dt)), {}, x_shape)
    return Operands((_uniform(rng, x_shape, dt), _uniform(rng, y_shape, dt)), {}, w_shape)


_OPS = {
    "gemm": _gemm_operands,
    "conv2d_fwd": _conv_operands,
    "conv2d_bwd_data": _conv_operands,
    "conv2d_bwd_filter": _conv_operands,
}


def tunable(p) -> bool:
    return p.op in _OPS


def operands(p, rng: np.random.Generator) -> Operands:
    """Random inputs for p. MemoryError when they do not fit."""
    make = _OPS.get(p.op)
    if make is None:
        raise ValueError(f"autotune: operator {p.op!r} is not tunable; tunable ones: {sorted(_OPS)}")
    return make(p, rng)


def run(algorithm, p, ops: Operands, out: np.ndarray, workspace_bytes: int):
    """One call of algorithm on p, as the public API makes it (workspace allocated by the caller's side,
    as in api.py, and counted in the time: it is part of what a call costs)."""
    kwargs = dict(ops.kwargs)
    if p.op != "gemm":
        kwargs["workspace"] = None if workspace_bytes == 0 else np.empty(workspace_bytes // p.itemsize, p.dtype)
    algorithm.run(p, *ops.args, out=out, **kwargs)
    return out
