"""Algorithms and their registry.

An Algorithm is one way to compute a Problem. The registry keeps, per (op, backend), an ordered list;
dispatch walks it and every rejection carries its reason. Adding an algorithm is one module here, its
kernels, and its entry in that module's ALGORITHMS list.
"""
from __future__ import annotations

from .._config import changed
from .base import Algorithm, Candidate
from . import conv_cpu, gemm_cpu, gemm_cuda, rnn_cpu, rnn_cuda

_REGISTRY: dict[tuple[str, str], list[Algorithm]] = {}


def register(algo: Algorithm) -> Algorithm:
    key = (algo.op, algo.backend)
    names = [a.name for a in _REGISTRY.get(key, [])]
    if algo.name in names:
        raise ValueError(f"register: {algo.op}/{algo.backend} already has an algorithm named {algo.name!r}")
    _REGISTRY.setdefault(key, []).append(algo)
    changed()  # dispatch's remembered decisions were made without this registry
    return algo


def unregister(algo: Algorithm) -> None:
    """Remove an algorithm registered before (a plugin's, or a test's); ValueError if it is not there."""
    key = (algo.op, algo.backend)
    if algo not in _REGISTRY.get(key, []):
        raise ValueError(f"unregister: {algo!r} is not registered")
    _REGISTRY[key].remove(algo)
    changed()  # dispatch's remembered decisions were made without this registry


def algorithms(op: str, backend: str) -> list[Algorithm]:
    """The ordered algorithms for (op, backend); empty when there are none."""
    return list(_REGISTRY.get((op, backend), []))


def all_algorithms() -> list[Algorithm]:
    return [a for algos in _REGISTRY.values() for a in algos]


def get(op: str, backend: str, name: str) -> Algorithm:
    for a in _REGISTRY.get((op, backend), []):
        if a.name == name:
            return a
    known = [a.name for a in _REGISTRY.get((op, backend), [])]
    raise ValueError(f"{op}: no {backend} algorithm named {name!r}; known: {known}")


# The registry: each module's ALGORITHMS in order, GEMM, convolution, RNN on the CPU, then the GPU's. Within an operator the order
# is the preference where nothing else decides (see dispatch.py).
for _module in (gemm_cpu, conv_cpu, rnn_cpu, gemm_cuda, rnn_cuda):
    for _algo in _module.ALGORITHMS:
        register(_algo)

__all__ = ["Algorithm", "Candidate", "register", "unregister", "algorithms", "all_algorithms", "get"]
