"""Imports the CPU kernels as dnnkit._cpu: the extension module built for the highest instruction-set level
that this CPU and OS run (dnnkit._cpu_ref, _cpu_avx2 or _cpu_avx512; setup.py), capped by DNNKIT_ISA.
dnnkit._cpu_detect asks the CPU (CPUID) and the OS (XGETBV) which level that is, before any code compiled
for a level above the baseline is loaded.

Where no kernel module can be loaded (a source tree that was never built, a platform without one),
dnnkit._cpu is a stand-in whose every function raises ImportError with the reason: `import dnnkit`, its
problems, descriptors and cache tools, and dnnkit.kernels still work. Only backends/cpu.py reads this."""
from __future__ import annotations

import importlib
import sys
import warnings

LEVELS = ("ref", "avx2", "avx512", "amx")
MODULE_OF_LEVEL = {"ref": "ref", "avx2": "avx2", "avx512": "avx512", "amx": "avx512"}


def _load():
    try:
        from . import _cpu_detect
    except ImportError:
        raise ImportError("no CPU kernel module in this build (dnnkit._cpu_detect is missing)") from None

    bad = _cpu_detect.invalid_isa_limit()
    if bad is not None:
        warnings.warn(f"DNNKIT_ISA={bad!r} names no level (one of {', '.join(LEVELS)}); it is ignored",
                      RuntimeWarning, stacklevel=4)
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
    raise ImportError(f"no CPU kernel module in this build (looked for dnnkit._cpu_{', _cpu_'.join(tried)})")


class Unavailable:
    """dnnkit._cpu where no kernel module loads: each attribute is a function (or, for PackedWeight, a
    class) that raises ImportError naming the reason."""

    def __init__(self, reason: str):
        self.__name__ = "dnnkit._cpu (unavailable)"
        self.reason = reason

    def _raise(self, *args, **kwargs):
        raise ImportError(f"dnnkit: the CPU kernels are unavailable: {self.reason}. Build them with "
                          f"`pip install .` (or `python setup.py build_ext --inplace` in a source tree)")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "PackedWeight":
            raise_ = self._raise

            class PackedWeight:
                def __init__(self, *args, **kwargs):
                    raise_()
            return PackedWeight
        return self._raise


def _load_or_stand_in():
    try:
        return _load(), None
    except ImportError as e:
        reason = str(e)
        return Unavailable(reason), reason


cpu, error = _load_or_stand_in()
sys.modules["dnnkit._cpu"] = cpu
setattr(sys.modules[__package__], "_cpu", cpu)  # dnnkit._cpu, for tests and debugging
