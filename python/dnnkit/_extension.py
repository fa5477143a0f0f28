"""Imports the CPU kernels as dnnkit._cpu: the extension module built for the highest instruction-set level
that this CPU and OS run (dnnkit._cpu_ref, _cpu_avx2 or _cpu_avx512; setup.py), capped by DNNKIT_ISA.
dnnkit._cpu_detect asks the CPU (CPUID) and the OS (XGETBV) which level that is, before any code compiled
for a level above the baseline is loaded. dnnkit/__init__.py imports this module first."""
from __future__ import annotations

import importlib
import sys
import warnings

from . import _cpu_detect

LEVELS = ("ref", "avx2", "avx512", "amx")
MODULE_OF_LEVEL = {"ref": "ref", "avx2": "avx2", "avx512": "avx512", "amx": "avx512"}


def _load():
    bad = _cpu_detect.invalid_isa_limit()
    if bad is not None:
        warnings.warn(f"DNNKIT_ISA={bad!r} names no level (one of {', '.join(LEVELS)}); it is ignored",
                      RuntimeWarning, stacklevel=3)
    level = min(LEVELS.index(_cpu_detect.cpu_level()), LEVELS.index(_cpu_detect.level_limit()))
    tried = []
    # The highest module this build has, at or below that level (a build may leave levels out).
    for name in dict.fromkeys(MODULE_OF_LEVEL[lv] for lv in reversed(LEVELS[:level + 1])):
        try:
            return importlib.import_module(f"dnnkit._cpu_{name}")
        except ModuleNotFoundError as e:
            if e.name != f"dnnkit._cpu_{name}":
                raise
            tried.append(name)
    raise ImportError(f"dnnkit: no CPU kernel module in this build (looked for {', '.join(tried)})")


cpu = sys.modules["dnnkit._cpu"] = _load()
