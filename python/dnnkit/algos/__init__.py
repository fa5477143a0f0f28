"""Algorithms and their registry.

An Algorithm is one way to compute a Problem. The registry keeps, per (op, backend), an ordered list;
dispatch walks it and every rejection carries its reason. Adding an algorithm is one module here, its
kernels, and one line in _REGISTRY below.
"""
from __future__ import annotations

from .base import Algorithm, Candidate
from . import conv_cpu, gemm_cpu, rnn_cpu

_REGISTRY: dict[tuple[str, str], list[Algorithm]] = {}
_version = [0]  # bumped by register(): dispatch's cached decisions name the version they were made with


def version() -> int:
    return _version[0]


def register(algo: Algorithm) -> Algorithm:
    key = (algo.op, algo.backend)
    names = [a.name for a in _REGISTRY.get(key, [])]
    if algo.name in names:
        raise ValueError(f"register: {algo.op}/{algo.backend} already has an algorithm named {algo.name!r}")
    _REGISTRY.setdefault(key, []).append(algo)
    _version[0] += 1
    return algo


def unregister(algo: Algorithm) -> None:
    """Remove an algorithm registered before (a plugin's, or a test's); ValueError if it is not there."""
    key = (algo.op, algo.backend)
    if algo not in _REGISTRY.get(key, []):
        raise ValueError(f"unregister: {algo!r} is not registered")
    _REGISTRY[key].remove(algo)
    _version[0] += 1


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


# The registry, in order of preference when nothing else decides.
register(gemm_cpu.SmallMGemm())
register(gemm_cpu.WtDirectGemm())
register(gemm_cpu.BlockedGemm())
register(gemm_cpu.GotoGemm())
register(gemm_cpu.StreamGemm())
register(conv_cpu.Im2colGemmFwd())
register(conv_cpu.ImplicitGemmFwd())
register(conv_cpu.WinogradF4x4())
register(conv_cpu.WinogradF2x2())
register(conv_cpu.FftFwd())
register(conv_cpu.DepthwiseFwd())
register(conv_cpu.DirectFwd())
register(conv_cpu.GemmCol2imBwdData())
register(conv_cpu.WinogradF4x4BwdData())
register(conv_cpu.WinogradF2x2BwdData())
register(conv_cpu.DirectBwdData())
register(conv_cpu.Im2colGemmBwdFilter())
register(conv_cpu.WinogradF4x4BwdFilter())
register(conv_cpu.WinogradF2x2BwdFilter())
register(conv_cpu.DirectBwdFilter())
for _algo in rnn_cpu.all_fused():
    register(_algo)

__all__ = ["Algorithm", "Candidate", "register", "unregister", "algorithms", "all_algorithms", "get"]
