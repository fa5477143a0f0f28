"""Builds dnnkit: the C++ extension from csrc/, the package from python/dnnkit, and the Numba-CUDA kernels
from kernels/ as dnnkit.kernels.

The build is portable: a wheel built on one machine runs on any x86-64 CPU. The extension is built once
per instruction-set level, each a whole module for the CPUs of that level:
  dnnkit._cpu_ref     the portable kernels; the generic code compiled for the architecture's baseline
                      (on x86-64: SSE2). The only module on other architectures.
  dnnkit._cpu_avx2    the generic code compiled for AVX2+FMA, with the AVX2 kernels
  dnnkit._cpu_avx512  the generic code compiled for AVX-512 (F, BW, DQ, VL), with the AVX2, AVX-512 and
                      AMX kernels (the AMX tiles are a switch inside it)
and dnnkit._cpu_detect, compiled for the baseline, asks the CPU and the OS (CPUID, XGETBV) which level
runs here; dnnkit/_cpu.py imports that level's module (DNNKIT_ISA caps it) as dnnkit._cpu. Every module
holds all of the generic code (drivers, packing, transforms, element-wise passes) compiled for its level,
so each runs as fast as a build for its CPUs alone, and no function compiled for one level can be called
on a CPU of a lower one (each module is linked apart). The kernels written for one instruction set live
in files named for it (csrc/**/*_avx2.cpp, *_avx512.cpp, *_amx.cpp), compiled with that set's flags only
(ISA_FLAGS), in every module of that level or above; within a module they are chosen at run time
(dnnkit.set_isa lowers the choice, for tests).

Environment:
  DNNKIT_BUILD_ISA=ref|avx2|avx512|amx   the highest level built (default: amx, every level the compiler
                      supports, on x86-64; ref elsewhere). ref builds the portable module only, with no
                      x86 flag and no intrinsic.
  DNNKIT_NATIVE=1     every file also gets -march=native: a build for this machine only.
  DNNKIT_DEBUG=1      -O0 -g, for debugging the kernels.
  DNNKIT_BUILD_JOBS   parallel compile jobs (default: the machine's cores).
"""
import hashlib
import os
import platform
import sys
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext, has_flag
from setuptools import find_packages, setup

ParallelCompile("DNNKIT_BUILD_JOBS", default=0).install()

# Each instruction set's flags, lowest first: a level's CPUs run every level before it, and
# csrc/cpu_info.cpp asks CPUID and XGETBV for exactly these features before a level is used.
ISA_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"],
    "amx": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512bf16",
            "-mamx-tile", "-mamx-bf16"],
}
# Tuning flags, where the compiler has them (GCC 12 and newer): copies of a known size (std::memcpy into
# and out of vectors, everywhere in the generic kernels) by whole vectors of the level's width. Under
# -mtune=generic GCC otherwise copies 32 bytes as two 16-byte halves through the stack, and every such
# vector load then waits on a failed store forwarding (bench/log/2026-11-25-zen2-avx2-path.md).
TUNE_FLAGS = {
    "avx2": ["-mmove-max=256", "-mstore-max=256"],
    "avx512": ["-mmove-max=512", "-mstore-max=512"],
    "amx": ["-mmove-max=512", "-mstore-max=512", "-mtune=sapphirerapids"],
}
# The AMX files run only on the cores that have the tiles (Sapphire Rapids and its successors): they are
# scheduled for those cores, as a -march=native build would schedule them (bench/log/2026-11-27-sapphire-rapids.md, the
# portable build beside a -march=native one).
LEVELS = ["ref", *ISA_FLAGS]
# The modules, each with the levels whose kernel files it holds; its generic code gets its own level's flags.
MODULES = {"ref": ["ref"], "avx2": ["ref", "avx2"], "avx512": ["ref", "avx2", "avx512", "amx"]}
X86 = platform.machine().lower() in ("x86_64", "amd64")
DETECT = "csrc/cpu_detect_module.cpp"  # the detection module's binding


def isa_of(path: str) -> str:
    """The instruction set a source file is written for: its name's suffix, else 'ref' (generic code)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return next((isa for isa in ISA_FLAGS if stem.endswith("_" + isa)), "ref")


def build_level() -> str:
    want = os.environ.get("DNNKIT_BUILD_ISA", "amx" if X86 else "ref")
    if want not in LEVELS:
        sys.exit(f"DNNKIT_BUILD_ISA must be one of {', '.join(LEVELS)}, got {want!r}")
    if want != "ref" and not X86:
        sys.exit(f"DNNKIT_BUILD_ISA={want}: x86-64 kernels cannot be built for {platform.machine()}")
    return want


common_args = ["-fopenmp", "-Wall", "-Wno-unknown-pragmas", "-Wno-psabi"]
common_args += ["-O0", "-g"] if os.environ.get("DNNKIT_DEBUG") == "1" else ["-O3"]
if os.environ.get("DNNKIT_NATIVE") == "1":
    common_args += ["-march=native"]
kernel_sources = sorted(s for s in glob("csrc/**/*.cpp", recursive=True) if s != DETECT)
headers = sorted(glob("csrc/**/*.h", recursive=True))

extensions = [
    Pybind11Extension("dnnkit._cpu_detect", [DETECT, "csrc/cpu_info.cpp"], include_dirs=["csrc"], cxx_std=17,
                      extra_compile_args=common_args, extra_link_args=["-fopenmp"], depends=headers)
]
for level in MODULES:
    extensions.append(Pybind11Extension(
        f"dnnkit._cpu_{level}", kernel_sources, include_dirs=["csrc"], cxx_std=17,
        extra_compile_args=list(common_args), extra_link_args=["-fopenmp"], depends=headers))


class BuildExt(build_ext):
    """Builds each level's module up to DNNKIT_BUILD_ISA and what the compiler supports (a level whose
    flags it lacks is left out, with those above it; AMX alone is left out of the AVX-512 module). Inside a
    module the generic files get the module's level flags and each kernel file its own set's
    (ISA_FLAGS, with TUNE_FLAGS where the compiler has them); DNNKIT_HAVE_<ISA> tells the code which kernel files are in, DNNKIT_MODULE names the module.
    Every module compiles into its own temporary folder, one per set of flags. On x86-64, where the assembler supports it, no jump
    crosses or ends on a 32-byte boundary: Skylake-derived Intel cores (the JCC erratum's microcode fix)
    otherwise run such a jump from the legacy decoders, and an unrelated change that moves a kernel's
    inner loop by a few bytes can slow it by 15%."""

    def build_extensions(self):
        top = LEVELS.index(build_level())
        supported = ["ref"]
        for isa in LEVELS[1:top + 1]:
            if not all(has_flag(self.compiler, f) for f in ISA_FLAGS[isa]):
                print(f"dnnkit: the compiler does not support {isa}'s flags; building without {isa} and above")
                break
            supported.append(isa)
        flags = {isa: ISA_FLAGS[isa] + [f for f in TUNE_FLAGS[isa] if has_flag(self.compiler, f)] for isa in supported[1:]}
        jcc = "-Wa,-mbranches-within-32B-boundaries"
        extra = [jcc] if X86 and has_flag(self.compiler, jcc) else []
        kept = []
        for e in self.extensions:
            level = e.name.rsplit("_", 1)[1]
            if level == "detect":
                e.extra_compile_args += extra + ["-DDNNKIT_MODULE=_cpu_detect"]
                kept.append(e)
                continue
            if level not in supported:
                stale = self.get_ext_fullpath(e.name)  # a module of an earlier build with more levels
                if os.path.exists(stale):
                    os.remove(stale)
                continue
            isas = [isa for isa in MODULES[level] if isa in supported]
            e.sources = [s for s in e.sources if isa_of(s) in isas]
            e.extra_compile_args += extra + [f"-DDNNKIT_MODULE=_cpu_{level}"]
            e.extra_compile_args += [f"-DDNNKIT_HAVE_{isa.upper()}=1" for isa in isas if isa != "ref"]
            e.dnnkit_level = level
            kept.append(e)
        self.extensions = kept
        self.dnnkit_flags = flags
        super().build_extensions()

    def build_extension(self, ext):
        level = getattr(ext, "dnnkit_level", "ref")
        temp, compile_one = self.build_temp, self.compiler._compile

        def compile_with_isa_flags(obj, src, ext_, cc_args, extra_postargs, pp_opts):
            isa = isa_of(src)
            flags = self.dnnkit_flags.get(isa if isa != "ref" else level, [])
            compile_one(obj, src, ext_, cc_args, extra_postargs + flags, pp_opts)

        # Its own folder per module and set of flags: objects built with other flags are never reused.
        key = hashlib.sha1(repr((ext.extra_compile_args, level, self.dnnkit_flags)).encode()).hexdigest()[:8]
        self.build_temp = os.path.join(temp, f"{ext.name}-{key}")
        force = self.force
        self.force = force or not os.path.isdir(self.build_temp)  # flags changed: rebuild, however new the module
        self.compiler._compile = compile_with_isa_flags
        try:
            super().build_extension(ext)
        finally:
            self.build_temp, self.compiler._compile, self.force = temp, compile_one, force


packages = find_packages(where="python") + ["dnnkit.kernels"]
setup(
    packages=packages,
    package_dir={"": "python", "dnnkit.kernels": "kernels"},
    package_data={"dnnkit": ["data/*.txt"]},
    ext_modules=extensions,
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
