"""The backend seam: device arrays reach the CUDA backend (which runs them, says it has no kernels for the
operator yet, or why the GPU is unavailable), host and device arrays mixed in one call are an error naming the arguments, `import
dnnkit` works without the CPU kernel module, and the package's imports have no cycles and reach the kernel
module only from backends/ and algos/."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import dnnkit
from dnnkit import backends

PACKAGE = pathlib.Path(dnnkit.__file__).parent


class FakeCudaArray:
    """What CuPy arrays, PyTorch CUDA tensors and Numba device arrays have in common."""

    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "data": (0, False),
                                         "version": 3, "strides": None}


class FakeDLPackCuda:
    """A DLPack producer on a CUDA device (kDLCUDA = 2), without __cuda_array_interface__."""

    shape, ndim = (2, 2), 2

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise RuntimeError("not readable on the host")


def _g(*shape):
    return FakeCudaArray(shape)


def _h(*shape):
    return np.ones(shape, np.float32)


def _lstm_weights(make, H=3, I=2):
    return [make(4 * H, I), make(4 * H, H), make(4 * H), make(4 * H)]


def test_device_of():
    assert backends.device_of(None) is None
    assert backends.device_of(_h(2)) == "cpu"
    assert backends.device_of([1.0, 2.0]) == "cpu"
    assert backends.device_of(_g(2)) == "cuda"
    assert backends.device_of(FakeDLPackCuda()) == "cuda"


GPU_OPS = [
    ("gemm", lambda: dnnkit.gemm(_g(2, 3), _g(3, 4))),
    ("linear", lambda: dnnkit.linear(_g(5, 3), _g(4, 3), _g(4))),
    ("linear_backward", lambda: dnnkit.linear_backward(_g(5, 4), _g(5, 3), _g(4, 3))),
    ("explain", lambda: dnnkit.explain("gemm", _g(2, 3), _g(3, 4))),
    ("lstm", lambda: dnnkit.lstm(_g(4, 2, 2), None, None, _lstm_weights(_g))),
    ("gru", lambda: dnnkit.gru(FakeDLPackCuda(), None, [_g(9, 2), _g(9, 3)])),
    ("lstm_cell", lambda: dnnkit.lstm_cell(_g(2, 2), None, *_lstm_weights(_g))),
    ("pack_weight", lambda: dnnkit.pack_weight(_g(4, 3))),
]


@pytest.mark.skipif(dnnkit.backends.cuda.status()["available"], reason="a GPU is here: fake arrays would reach it")
@pytest.mark.parametrize("op, call", GPU_OPS, ids=[op for op, _ in GPU_OPS])
def test_gpu_operators_say_why_the_gpu_is_unavailable(op, call):
    """The operators with GPU kernels, given GPU arrays where no GPU (or no numba-cuda) is: the reason."""
    with pytest.raises(RuntimeError, match=r"^(gemm|linear|linear_backward|lstm|gru|lstm_cell|pack_weight): GPU "
                                           r"arrays given but the GPU backend is unavailable: (no CUDA driver|"
                                           r"numba-cuda is not installed)"):
        call()


ALL_ON_GPU = [
    ("conv2d", lambda: dnnkit.conv2d(_g(1, 2, 5, 5), _g(3, 2, 3, 3))),
    ("conv2d", lambda: dnnkit.conv2d(_g(1, 2, 5, 5), _g(3, 2, 2, 2), padding="same")),
    ("conv2d_backward_data", lambda: dnnkit.conv2d_backward_data((1, 2, 5, 5), _g(3, 2, 3, 3), _g(1, 3, 3, 3))),
    ("conv2d_backward_filter", lambda: dnnkit.conv2d_backward_filter(_g(1, 2, 5, 5), (3, 2, 3, 3), _g(1, 3, 3, 3))),
    ("conv2d_backward_bias", lambda: dnnkit.conv2d_backward_bias(_g(1, 3, 3, 3))),
]


@pytest.mark.parametrize("op, call", ALL_ON_GPU, ids=[f"{op}-{i}" for i, (op, _) in enumerate(ALL_ON_GPU)])
def test_device_arrays_reach_the_cuda_backend(op, call):
    """Every array on the GPU: the CUDA backend answers, naming the operator; no host copy is tried."""
    with pytest.raises(NotImplementedError, match=rf"^{op}: GPU arrays given, and dnnkit has no GPU kernels for "
                                                  r"this operator yet"):
        call()


MIXED = [
    ("gemm", "a", "b", lambda: dnnkit.gemm(_g(2, 3), _h(3, 4))),
    ("gemm", "c", "a, b", lambda: dnnkit.gemm(_h(2, 3), _h(3, 4), _g(2, 4))),
    ("linear", "bias", "input, weight", lambda: dnnkit.linear(_h(5, 3), _h(4, 3), _g(4))),
    ("linear_backward", "grad_output", "input, weight", lambda: dnnkit.linear_backward(_g(5, 4), _h(5, 3), _h(4, 3))),
    ("conv2d", "weight", "input", lambda: dnnkit.conv2d(_h(1, 2, 5, 5), _g(3, 2, 3, 3))),
    ("conv2d", "workspace", "input, weight", lambda: dnnkit.conv2d(_h(1, 2, 5, 5), _h(3, 2, 3, 3), workspace=_g(64))),
    ("conv2d_backward_filter", "grad_output", "input",
     lambda: dnnkit.conv2d_backward_filter(_h(1, 2, 5, 5), (3, 2, 3, 3), _g(1, 3, 3, 3))),
    ("lstm", "weights[1]", "input, weights[0]",
     lambda: dnnkit.lstm(_h(4, 2, 2), None, None, [_h(12, 2), _g(12, 3), _h(12), _h(12)])),
    ("gru_cell", "hx", "input, w_ih", lambda: dnnkit.gru_cell(_h(2, 2), _g(2, 3), _h(9, 2), _h(9, 3))),
    ("lstm_cell", "hx[1]", "input, hx[0]",
     lambda: dnnkit.lstm_cell(_h(2, 2), (_h(2, 3), _g(2, 3)), *_lstm_weights(_h))),
]


@pytest.mark.parametrize("op, on_gpu, on_host, call", MIXED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MIXED)])
def test_mixed_devices_are_an_error_naming_the_arguments(op, on_gpu, on_host, call):
    with pytest.raises(TypeError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"{op}: arrays on different devices"), msg
    assert f"{on_gpu} on the GPU (CUDA)" in msg and on_host in msg, msg


def test_device_gradient_for_a_host_forward_is_an_error():
    x = np.ones((3, 2, 2), np.float32)
    out, _, reserve = dnnkit.lstm(x, None, None, _lstm_weights(_h), train=True)
    with pytest.raises(TypeError, match="lstm_backward: grad_output is on a CUDA device but the forward ran on "
                                        "the host"):
        dnnkit.lstm_backward(_g(*out.shape), None, None, reserve)


def test_info_lists_both_backends():
    info = dnnkit.info()
    assert info["backends"]["cpu"] == {"available": True, "reason": None}
    cuda = info["backends"]["cuda"]
    assert isinstance(cuda["available"], bool)
    assert cuda["available"] or cuda["reason"]  # unavailable says why
    assert cuda["kernels"] == sorted({a.op for a in dnnkit.algos.all_algorithms() if a.backend == "cuda"})


def test_import_works_without_the_cpu_kernel_module(tmp_path):
    """A build without its kernel module (a source tree never built): `import dnnkit`, info(), problems and
    dnnkit.kernels work; a CPU call raises ImportError saying why and how to build."""
    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("dnnkit._cpu_"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import numpy as np
import dnnkit, dnnkit.kernels
info = dnnkit.info(gpu=False)
assert info["backends"]["cpu"]["available"] is False, info
assert "dnnkit._cpu_detect" in info["backends"]["cpu"]["reason"], info
assert dnnkit.GemmProblem.parse("m2n3k4").flops == 48
try:
    dnnkit.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))
except ImportError as e:
    assert "the CPU kernels are unavailable" in str(e) and "pip install" in str(e), e
else:
    raise AssertionError("gemm ran without kernels")
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def _imports(path: pathlib.Path):
    """(module named, imported names) of every import statement in a file, relative ones resolved."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    pkg = parts if path.name == "__init__.py" else parts[:-1]
    if path.name == "__init__.py":
        pkg = parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_kernel_module_is_reached_only_from_backends_and_algos():
    kernel_modules = {"dnnkit._cpu", "dnnkit._extension", "dnnkit.backends.cpu.ext"}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name.startswith(("dnnkit.backends", "dnnkit.algos")) or name == "dnnkit._extension":
            continue
        for module, names in _imports(path):
            targets = {module} | {f"{module}.{n}" for n in names}
            if (targets & kernel_modules) or any(t.startswith("dnnkit._cpu_") for t in targets):
                offenders.append(f"{name} imports {sorted(targets & kernel_modules) or module}")
    assert not offenders, offenders


def test_no_import_cycles():
    """No module imports (at its top or inside a function) one that imports it back, directly or not;
    the package's __init__ (which gathers the public names) and the command line aside."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for module, names in _imports(path):
            for n in names or [""]:
                full = f"{module}.{n}" if n else module
                target = full if full in modules else module
                if target in modules and target not in ("dnnkit", name) and not n.startswith("_cpu"):
                    deps.add(target)
        graph[name] = deps
    graph.pop("dnnkit", None)
    graph.pop("dnnkit.cli", None)
    graph.pop("dnnkit.__main__", None)

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return trail + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in (cycle_from(m) for m in graph) if c]
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles)


def test_the_cpu_path_imports_no_gpu_library():
    """import dnnkit and host calls leave numba and CuPy unimported: the GPU path loads them when asked."""
    code = ("import sys, numpy as np, dnnkit\n"
            "a = np.ones((3, 4), np.float32)\n"
            "dnnkit.gemm(a, a.T); dnnkit.linear(a, a)\n"
            "dnnkit.lstm(np.ones((2, 1, 3), np.float32), None, None, [np.ones((8, 3), np.float32), "
            "np.ones((8, 2), np.float32)])\n"
            "print(sorted(m for m in ('numba', 'cupy', 'torch') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_a_numba_cuda_that_cannot_compile_makes_the_gpu_unavailable(monkeypatch):
    """numba-cuda imports but its compiler's modules do not (a NumPy it was not built for): the GPU backend
    says so once, up front, instead of every call failing inside Numba."""
    pytest.importorskip("numba.cuda", reason="numba-cuda is not installed")
    from dnnkit.backends import cuda

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setitem(sys.modules, "numba.cuda.cudaimpl", None)  # its import now raises ImportError
    cuda.status.cache_clear()
    try:
        s = cuda.status()
    finally:
        cuda.status.cache_clear()
    assert not s["available"] and s["reason"].startswith("numba-cuda cannot compile kernels with NumPy ")
