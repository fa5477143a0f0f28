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

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
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

packages = find_packages(where="python") + ["dnnkit.kernels"]
setup(
    packages=packages,
    package_dir={"": "python", "dnnkit.kernels": "kernels"},
    package_data={"dnnkit": ["data/*.txt"]},
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext},
    zip_safe=False,
)
