"""Plans: what dispatch decides for a problem, made once and kept.

A Plan is the algorithm that runs a problem, the workspace it needs there, and its run() bound to the
problem. dispatch.plan() makes one per (problem, algo argument, workspace limits, dispatch state) and
keeps it; the public functions keep theirs per call signature, so that a repeated call is a dictionary
lookup and a kernel call. Every such cache is a Memo.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable


class Memo(dict):
    """A dictionary of decisions (or problems) bounded at `limit` entries: full, it starts over. Keys hold
    everything the value depends on, so an entry is never stale, only dropped."""

    __slots__ = ("limit",)

    def __init__(self, limit: int = 4096):
        super().__init__()
        self.limit = limit

    def put(self, key, value):
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """How one problem runs: the algorithm, the workspace bytes its run needs (the caller allocates them,
    or passes its own), and run(*arrays, out=..., **params), the algorithm's run() on this problem."""

    problem: Any
    algorithm: Any
    workspace_bytes: int
    run: Callable

    @classmethod
    def of(cls, p, algorithm) -> "Plan":
        return cls(p, algorithm, int(algorithm.workspace_bytes(p)), functools.partial(algorithm.run, p))
