"""Builds dnnkit: the C++ extension dnnkit._cpu from csrc/, the package from python/dnnkit, and the
Numba-CUDA kernels from kernels/ as dnnkit.kernels.

Environment:
  DNNKIT_PORTABLE=1   do not tune the build for this CPU (-march=native is dropped); the micro-kernels
                      for AVX2 and AVX-512 are compiled either way and chosen at run time from CPUID.
  DNNKIT_DEBUG=1      -O0 -g, for debugging the kernels.
"""
import os
import sys
from glob import glob

import platform

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext, has_flag
from setuptools import find_packages, setup

ParallelCompile("DNNKIT_BUILD_JOBS", default=0).install()

sources = sorted(glob("csrc/**/*.cpp", recursive=True))
extra_compile_args = ["-fopenmp", "-Wall", "-Wno-unknown-pragmas"]
extra_link_args = ["-fopenmp"]
if os.environ.get("DNNKIT_DEBUG") == "1":
    extra_compile_args += ["-O0", "-g"]
else:
    extra_compile_args += ["-O3"]
if os.environ.get("DNNKIT_PORTABLE") != "1" and sys.platform.startswith("linux"):
    extra_compile_args += ["-march=native"]

ext = Pybind11Extension(
    "dnnkit._cpu",
    sources,
    include_dirs=["csrc"],
    cxx_std=17,
    extra_compile_args=extra_compile_args,
    extra_link_args=extra_link_args,
    depends=sorted(glob("csrc/**/*.h", recursive=True)),
)

class BuildExt(build_ext):
    """On x86-64, where the assembler supports it: no jump crosses or ends on a 32-byte boundary. Skylake-
    derived Intel cores (the JCC erratum's microcode fix) otherwise run such a jump from the legacy
    decoders, and an unrelated change that moves a kernel's inner loop by a few bytes can slow it by 15%
    (measured on conv2d_backward_data of ResNet-50's conv1 on a Cascade Lake)."""

    def build_extensions(self):
        flag = "-Wa,-mbranches-within-32B-boundaries"
        if platform.machine().lower() in ("x86_64", "amd64") and has_flag(self.compiler, flag):
            for e in self.extensions:
                e.extra_compile_args.append(flag)
        super().build_extensions()


packages = find_packages(where="python") + ["dnnkit.kernels"]
setup(
    packages=packages,
    package_dir={"": "python", "dnnkit.kernels": "kernels"},
    package_data={"dnnkit": ["data/*.txt"]},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
