"""The kernels' machine code, inspected without a GPU: PTX from Numba's compile_ptx, a cubin and its
resource use from nvJitLink (cuda.core), and SASS from cuobjdump.

variants() lists every kernel variant with the argument types it is launched with; compile() makes its
PTX for a compute capability; link() the cubin and the registers, shared and local memory (spills) it
uses; sass_profile() the instruction mix of its main loop. tests/gpu/test_codegen.py asserts on them and
bench/gpu_kernels.py prints them as a table.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from numba import types

from . import eltwise, gemm, gemm_tf32, probe, rnn, rnn_backward, rnn_persistent

# Per SM, for the occupancy figures (sm_80 and sm_90 alike, but shared memory: 164 and 228 KiB).
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
SHARED_PER_SM = {"sm_80": 164 * 1024, "sm_90": 228 * 1024}
STATIC_SHARED_PER_BLOCK = 48 * 1024


@dataclass(frozen=True)
class Variant:
    name: str
    dispatcher: object   # the cuda.jit kernel
    signature: tuple     # argument types, as launched
    threads: int         # threads a block
    wide_loads: bool     # whether its shared-memory operand loads are meant to be 128-bit
    main_loop_fma: bool  # whether it has a main loop of fused multiply-adds
    tensor_cores: bool = False  # whether its main loop is mma.sync (HMMA) instructions
    launch_bounds: tuple = ()  # as the kernel is built (default: (threads,))
    inner_loop_fma: bool = False  # whether its innermost loop with FMAs is its product (the persistent RNN's)


def _arr(dtype: str, ndim: int):
    return types.Array(getattr(types, dtype), ndim, "C")


def gemm_variants(layouts=(("n", "t"),)) -> list[Variant]:
    """Every tile x dtype x layout (default: a linear layer's, op(a) = a, op(b) = b^T), with bias, and the
    split-K kernel (64x64)."""
    out = []
    for tile_name, tile in gemm.TILES.items():
        for dtype in ("float32", "float64"):
            t = getattr(types, dtype)
            sig = (_arr(dtype, 2), _arr(dtype, 2), _arr(dtype, 2), _arr(dtype, 1), types.int64, types.int64,
                   types.int64, t, t, types.int64)
            wide = tile.tm % 4 == 0 and tile.tn % 4 == 0 and dtype == "float32"
            for ta, tb in layouts:
                k = gemm.gemm_kernel(tile, dtype, ta == "t", tb == "t", False, True, 0)
                out.append(Variant(gemm.kernel_name(tile, dtype, ta == "t", tb == "t", False, True), k, sig,
                                   tile.threads, wide, True, launch_bounds=gemm.launch_bounds(tile, dtype)))
            if tile_name == "64x64" and dtype == "float32":
                k = gemm_tf32.gemm_tf32_kernel(False, True, True, 0)
                out.append(Variant(gemm_tf32.kernel_name(False, True, True), k, sig, gemm_tf32.TILE.threads, False,
                                   False, tensor_cores=True, launch_bounds=gemm_tf32.LAUNCH_BOUNDS))
            if tile_name == "64x64":
                sig3 = (_arr(dtype, 2), _arr(dtype, 2), _arr(dtype, 3), _arr(dtype, 1)) + sig[4:]
                k = gemm.gemm_kernel(tile, dtype, False, True, True)
                out.append(Variant(gemm.kernel_name(tile, dtype, False, True, True), k, sig3, tile.threads, wide, True))
    return out


def eltwise_variants() -> list[Variant]:
    out = []
    for dtype in ("float32", "float64"):
        t = getattr(types, dtype)
        a2, a3, a1 = _arr(dtype, 2), _arr(dtype, 3), _arr(dtype, 1)
        i64 = types.int64
        out.append(Variant(f"splitk_reduce_{dtype}_bias_act4", gemm.splitk_reduce(dtype, True, 4),
                           (a3, a2, a1, i64, i64, i64, t, t), gemm.REDUCE_THREADS, False, False))
        out.append(Variant(f"activation_forward_{dtype}_act4", eltwise.activation_forward(dtype, 4),
                           (a2, a2, i64, i64), eltwise.ELTWISE_THREADS, False, False))
        out.append(Variant(f"activation_backward_{dtype}_act4_z", eltwise.activation_backward(dtype, 4, True),
                           (a2, a2, a2, i64, i64), eltwise.ELTWISE_THREADS, False, False))
        out.append(Variant(f"column_sums_{dtype}_acc", eltwise.column_sums(dtype, True), (a2, a1, i64, i64),
                           eltwise.SUM_COLUMNS * eltwise.SUM_ROWS, False, False))
        out.append(Variant(f"multiply_{dtype}", eltwise.multiply(dtype), (a1, a1, a1, i64), eltwise.ELTWISE_THREADS,
                           False, False))
    # the ceilings' probe: nothing but FMAs in its loop
    out.append(Variant("fma_peak_float32", probe.fma_peak("float32"),
                       (_arr("float32", 1), types.int64, types.float32, types.float32), probe.THREADS, False, True))
    return out


def rnn_variants() -> list[Variant]:
    """The RNN steps' gate kernels, forward (as training runs them) and backward, on strided 2-D views (a
    step's rows, a slice of the output)."""
    out = []
    step = rnn.STEP_X * rnn.STEP_Y
    for dtype in ("float32", "float64"):
        v2 = types.Array(getattr(types, dtype), 2, "A")
        i64 = types.int64
        out.append(Variant(f"lstm_step_{dtype}_train", rnn.lstm_step(dtype, True), (v2, v2, v2, v2, i64, i64), step,
                           False, False))
        out.append(Variant(f"gru_step_{dtype}_train", rnn.gru_step(dtype, True), (v2, v2, v2, v2, v2, i64, i64), step,
                           False, False))
        out.append(Variant(f"rnn_tanh_step_{dtype}", rnn.rnn_step(dtype, False), (v2, v2, i64, i64), step, False,
                           False))
        out.append(Variant(f"copy_{dtype}", rnn.copy(dtype), (v2, v2, i64, i64), step, False, False))
        out.append(Variant(f"add_{dtype}", rnn.add(dtype), (v2, v2, v2, i64, i64), step, False, False))
        out.append(Variant(f"lstm_step_backward_{dtype}", rnn_backward.lstm_step_backward(dtype),
                           (v2, v2, v2, v2, v2, v2, i64, i64), step, False, False))
        out.append(Variant(f"gru_step_backward_{dtype}", rnn_backward.gru_step_backward(dtype),
                           (v2, v2, v2, v2, v2, v2, v2, i64, i64), step, False, False))
        out.append(Variant(f"rnn_tanh_step_backward_{dtype}", rnn_backward.rnn_step_backward(dtype, False),
                           (v2, v2, v2, v2, i64, i64), step, False, False))
    return out


def persistent_variants() -> list[Variant]:
    """The persistent RNN kernel: a training LSTM of one row a lane and 8 batch rows a pass, a GRU of two
    rows and 4, a float64 tanh RNN of four rows and one."""
    out = []
    for mode, dtype, rt, bt, train in (("lstm", "float32", 1, 8, True), ("gru", "float32", 2, 4, False),
                                       ("rnn_tanh", "float64", 4, 1, False)):
        f = getattr(types, dtype)
        a2, v2, v3 = _arr(dtype, 2), types.Array(f, 2, "A"), types.Array(f, 3, "A")
        sig = (a2, a2, _arr(dtype, 1), v2, v2, v3, v3, a2, _arr("uint32", 1)) + (types.int64,) * 9
        out.append(Variant(rnn_persistent.kernel_name(mode, dtype, rt, bt, train),
                           rnn_persistent.persistent_kernel(mode, dtype, rt, bt, train), sig, rnn_persistent.THREADS,
                           bt >= 4 and dtype == "float32", False, launch_bounds=(rnn_persistent.THREADS, 1),
                           inner_loop_fma=rt * bt >= 8))  # (a shorter product loop NVVM unrolls whole)
    return out


def variants() -> list[Variant]:
    return gemm_variants() + eltwise_variants() + rnn_variants() + persistent_variants()


@functools.lru_cache(maxsize=None)
def compile_ptx(v: Variant, cc: tuple) -> str:
    from numba import cuda

    ptx, _ = cuda.compile_ptx(v.dispatcher.py_func, v.signature, cc=cc, launch_bounds=v.launch_bounds or (v.threads,))
    return ptx


@dataclass(frozen=True)
class Resources:
    registers: int
    shared_bytes: int
    local_bytes: int   # local memory: spills and local arrays
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    cubin: bytes

    def blocks_per_sm(self, threads: int, arch: str) -> int:
        """Resident blocks an SM holds: the least of the register file's (registers allocated per warp in
        units of 256), shared memory's, the thread limit's and the block limit's."""
        warps = -(-threads // 32)
        regs_warp = -(-max(self.registers, 1) * 32 // 256) * 256
        by_regs = REGISTERS_PER_SM // (regs_warp * warps)
        by_shared = SHARED_PER_SM[arch] // self.shared_bytes if self.shared_bytes else BLOCKS_PER_SM
        return max(0, min(by_regs, by_shared, THREADS_PER_SM // threads, BLOCKS_PER_SM))

    def occupancy(self, threads: int, arch: str) -> float:
        return self.blocks_per_sm(threads, arch) * threads / THREADS_PER_SM


def link(ptx: str, arch: str) -> Resources:
    """The cubin nvJitLink makes of ptx for arch ("sm_90"), and what its kernel uses."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    linker = Linker(ObjectCode.from_ptx(ptx.encode(), name="kernel"), options=LinkerOptions(arch=arch, verbose=True))
    cubin = bytes(linker.link("cubin").code)
    log = linker.get_info_log()

    def num(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    return Resources(registers=num(r"used (\d+) registers"), shared_bytes=num(r"(\d+) bytes smem"),
                     local_bytes=num(r"(\d+) bytes lmem"), stack_bytes=num(r"(\d+) bytes stack frame"),
                     spill_stores=num(r"(\d+) bytes spill stores"), spill_loads=num(r"(\d+) bytes spill loads"),
                     cubin=cubin)


def cuobjdump() -> str | None:
    """The cuobjdump executable (with nvdisasm beside it), from PATH or the NVIDIA pip wheels; None if absent."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for sub in ("cu13/bin", "cuda_cuobjdump/bin", "cu12/bin"):
            path = os.path.join(root, sub, "cuobjdump")
            if os.path.exists(path) and os.path.exists(os.path.join(root, sub, "nvdisasm")):
                return path
    return None


def sass(cubin: bytes) -> str:
    exe = cuobjdump()
    if exe is None:
        raise RuntimeError("cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm) is not installed")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        env = dict(os.environ, PATH=os.path.dirname(exe) + os.pathsep + os.environ.get("PATH", ""))
        return subprocess.run([exe, "-sass", path], capture_output=True, text=True, check=True, env=env).stdout


_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)")


@dataclass(frozen=True)
class SassProfile:
    instructions: int       # in the whole kernel
    ffma: int
    lds: dict               # LDS width ("LDS", "LDS.64", "LDS.128") -> count
    local: int              # LDL/STL instructions (spills)
    loop_instructions: int  # in the main loop: the loop with the most FFMA (or HMMA)
    loop_ffma: int
    loop_mma: int = 0       # HMMA instructions in that loop
    inner_instructions: int = 0  # in the innermost loop with FMAs (the fewest instructions)
    inner_ffma: int = 0
    inner_lds: tuple = ()   # that loop's shared loads, by width: (("LDS", n), ("LDS.128", n), ...)
    loop_early_stores: int = 0  # shared stores (STS) in the main loop before its first FFMA or HMMA

    @property
    def loop_ffma_share(self) -> float:
        return self.loop_ffma / self.loop_instructions if self.loop_instructions else 0.0


def sass_profile(text: str) -> SassProfile:
    """Instruction counts of a kernel's SASS (cuobjdump -sass), and of its main loop: the body of the
    backward branch (from its target to the branch) with the most FFMA."""
    ops, at_address, branches = [], {}, []
    for line in text.splitlines():
        m = _INSN.search(line)
        if not m:
            continue
        at_address[int(m.group(1), 16)] = len(ops)
        ops.append(m.group(2))
        if m.group(2) == "BRA":
            target = re.search(r"0x([0-9a-f]+)", m.group(3))
            if target:
                branches.append((len(ops) - 1, int(target.group(1), 16)))
    def widths(body):
        out = {}
        for op in body:
            if op.startswith("LDS"):
                key = "LDS" + next((w for w in (".128", ".64") if w in op), "")
                out[key] = out.get(key, 0) + 1
        return out

    best, inner, early = (0, 0, 0), None, 0
    for at, target in branches:
        start = at_address.get(target)
        if start is not None and start <= at:
            body = ops[start:at + 1]
            f = sum(op.startswith(("FFMA", "DFMA")) for op in body)
            h = sum(op.startswith("HMMA") for op in body)
            if (f + h, f) > (best[1] + best[2], best[1]):
                best = (len(body), f, h)
                first = next((i for i, op in enumerate(body) if op.startswith(("FFMA", "DFMA", "HMMA"))), len(body))
                early = sum(op.startswith("STS") for op in body[:first])
            if f and (inner is None or len(body) < len(inner[0])):
                inner = (body, f)
    lds = widths(ops)
    return SassProfile(instructions=len(ops), ffma=sum(op.startswith(("FFMA", "DFMA")) for op in ops), lds=lds,
                       local=sum(op.startswith(("LDL", "STL")) for op in ops), loop_instructions=best[0],
                       loop_ffma=best[1], loop_mma=best[2], inner_instructions=len(inner[0]) if inner else 0,
                       inner_ffma=inner[1] if inner else 0,
                       inner_lds=tuple(sorted(widths(inner[0]).items())) if inner else (), loop_early_stores=early)
