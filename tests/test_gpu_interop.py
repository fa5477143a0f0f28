"""GPU interop without a GPU: which stream a call runs on (stream=, else the caller's CuPy or PyTorch
current stream, else the default), what kind of array a result is (the input's library), and the errors
for streams and arrays that are not. Numba's driver, CuPy and PyTorch are stood in for by fakes."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dnnkit.backends import cuda as backend


class FakeStream:
    def __init__(self, handle):
        self.handle = handle


class FakeEvent:
    def __init__(self, waits):
        self.waits, self.on = waits, None

    def record(self, stream):
        self.on = stream.handle

    def wait(self, stream):
        self.waits.append((self.on, stream.handle))


class FakeNumbaCuda:
    """What backends/cuda.py asks of numba.cuda for streams, events and allocation; waits lists each
    (stream an event was recorded on, stream made to wait on it)."""

    def __init__(self):
        self.waits, self.synced = [], []

    def default_stream(self):
        return FakeStream(0)

    def external_stream(self, ptr):
        return FakeStream(ptr)

    def event(self, timing=True):
        return FakeEvent(self.waits)

    def as_cuda_array(self, obj, sync=True):
        if sync:
            self.synced.append(obj)
        return ("view of", obj)

    def device_array(self, shape, dtype, stream=None):
        return ("numba array", shape, dtype)


def _array_of(module: str, stream=None):
    """A device array of a library; stream: the "stream" its __cuda_array_interface__ names (version 3)."""
    iface = {} if stream is None else {"stream": stream}
    cls = type("Arr", (), {"__module__": module, "__cuda_array_interface__": iface, "device": "cuda:1"})
    return cls()


@pytest.fixture
def fakes(monkeypatch):
    numba_cuda = FakeNumbaCuda()
    monkeypatch.setattr(backend, "_cuda", lambda: numba_cuda)
    monkeypatch.setattr(backend, "simulator", lambda: False)
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=1234))
    cupy.empty = lambda shape, dtype: ("cupy array", shape, dtype)
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(current_stream=lambda device=None: types.SimpleNamespace(cuda_stream=5678))
    torch.float32 = "torch.float32"
    torch.empty = lambda shape, dtype, device: ("torch array", shape, dtype, device)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return numba_cuda


def test_the_callers_current_stream(fakes):
    assert backend.stream_for("gemm", None, _array_of("cupy._core.core")).handle == 1234
    assert backend.stream_for("gemm", None, _array_of("torch")).handle == 5678
    assert backend.stream_for("gemm", None, _array_of("numba.cuda.cudadrv.devicearray")).handle == 0
    assert backend.stream_for("gemm", None, None, _array_of("torch")).handle == 5678


def test_an_explicit_stream(fakes):
    assert backend.stream_for("gemm", 0, _array_of("torch")).handle == 0
    assert backend.stream_for("gemm", 42, _array_of("torch")).handle == 42
    assert backend.stream_for("gemm", types.SimpleNamespace(ptr=7), None).handle == 7           # a CuPy stream
    assert backend.stream_for("gemm", types.SimpleNamespace(cuda_stream=9), None).handle == 9   # a torch stream
    numba_stream = type("Stream", (), {"__module__": "numba.cuda.cudadrv.driver", "handle": 3})()
    assert backend.stream_for("gemm", numba_stream, None) is numba_stream
    with pytest.raises(TypeError, match="linear: stream must be a Numba, CuPy or PyTorch stream or an int handle, "
                                        "got str"):
        backend.stream_for("linear", "fast", None)


def test_calls_wait_on_the_gpu_for_operands_written_on_other_streams(fakes):
    # Written on the stream the call runs on (CuPy's current one; the legacy default stream by either
    # of its names), or naming no stream (PyTorch's): nothing to order, and never a host synchronization.
    on_current = _array_of("cupy._core.core", stream=1234)
    assert backend.stream_for("gemm", None, on_current, on_current).handle == 1234
    assert backend.stream_for("gemm", 0, _array_of("cupy._core.core", stream=1), _array_of("torch")).handle == 0
    assert fakes.waits == []
    # Written elsewhere: the call's stream waits on an event recorded there, once a producing stream.
    s = backend.stream_for("linear", 42, on_current, _array_of("cupy._core.core", stream=1), on_current, None)
    assert s.handle == 42 and fakes.waits == [(1234, 42), (1, 42)]
    fakes.waits.clear()
    packed = type("GpuPackedWeight", (), {"packed": _array_of("numba.cuda", stream=77)})()
    backend.after(FakeStream(5), packed, _array_of("torch"))
    assert fakes.waits == [(77, 5)]


def test_adopting_an_array_never_synchronizes_the_host(fakes, monkeypatch):
    monkeypatch.setattr(backend, "status", lambda: {"available": True, "reason": None, "devices": [], "driver": "1"})
    imported = []

    def as_cuda_array(obj, sync=True):
        imported.append(sync)
        return types.SimpleNamespace(dtype=np.dtype(np.float32), ndim=2, shape=(2, 2))

    monkeypatch.setattr(fakes, "as_cuda_array", as_cuda_array)
    view = backend.adopt("gemm", "a", _array_of("cupy._core.core", stream=1234), ndim=2)
    assert view.shape == (2, 2) and imported == [False]


def test_results_are_arrays_of_the_inputs_library(fakes):
    s = FakeStream(0)
    out, view = backend.empty("gemm", _array_of("cupy._core.core"), (2, 3), "float32", s)
    assert out == ("cupy array", (2, 3), "float32") and view == ("view of", out)
    out, view = backend.empty("gemm", _array_of("torch"), (2, 3), "float32", s)
    assert out == ("torch array", (2, 3), "torch.float32", "cuda:1")
    out, view = backend.empty("gemm", _array_of("numba.cuda"), (4,), "float64", s)
    assert out == view == ("numba array", (4,), "float64")
    # Memory from CuPy's or PyTorch's pool belongs to the library's current stream until the call's runs after it.
    assert fakes.synced == [] and fakes.waits == [(5678, 0)]


def test_adopt_checks_dtype_and_rank(monkeypatch):
    monkeypatch.setattr(backend, "status", lambda: {"available": True, "reason": None, "devices": [], "driver": "1"})

    class Dev:
        def __init__(self, dtype, ndim):
            self.dtype, self.ndim, self.shape = np.dtype(dtype), ndim, (2,) * ndim

    monkeypatch.setattr(backend, "_cuda", lambda: types.SimpleNamespace(as_cuda_array=lambda obj, sync: obj.dev))
    arr = _array_of("cupy")
    arr.dev = Dev(np.int32, 2)
    with pytest.raises(TypeError, match="gemm: a must have dtype float32 or float64, got int32"):
        backend.adopt("gemm", "a", arr, ndim=2)
    arr.dev = Dev(np.float32, 3)
    with pytest.raises(ValueError, match=r"gemm: a must be 2-D, got shape \(2, 2, 2\)"):
        backend.adopt("gemm", "a", arr, ndim=2)
    with pytest.raises(TypeError, match="gemm: b must be an array on the GPU like the others, got list"):
        backend.adopt("gemm", "b", [1.0])


def test_nominal_ceilings_from_the_devices_attributes(monkeypatch):
    h100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_bytes": 80 << 30, "sm_count": 132,
            "clock_khz": 1980000, "memory_clock_khz": 2619000, "memory_bus_bits": 5120}
    monkeypatch.setattr(backend, "status", lambda: {"available": True, "reason": None, "devices": [h100],
                                                    "driver": "13.0"})
    c = backend.ceilings()
    assert abs(c["fp32_flops"] / 1e12 - 66.9) < 0.1        # 2 x 128 lanes x 132 SMs x 1.98 GHz
    assert abs(c["tf32_flops"] / 1e12 - 535.3) < 0.1
    assert abs(c["bytes_per_s"] / 1e12 - 3.35) < 0.01      # HBM3: 2 x 2.619 GHz x 640 bytes
    monkeypatch.setattr(backend, "status", lambda: {"available": False, "reason": "none", "devices": [],
                                                    "driver": None})
    assert backend.ceilings() is None


def test_transposed_is_a_view_of_the_same_device_memory():
    """backend.transposed on a Numba device array: the shape and strides exchanged over the same memory,
    no copy (Numba's own .T copies through a transpose kernel it compiles at every call). Built without a
    GPU: the array's memory is a stand-in that nothing reads."""
    if backend.simulator():
        pytest.skip("the simulator's device arrays are NumPy arrays")
    devicearray = pytest.importorskip("numba.cuda.cudadrv.devicearray", reason="numba-cuda is not installed")
    memory = object()
    d = devicearray.DeviceNDArray((3, 5), (20, 4), np.float32, gpu_data=memory)
    t = backend.transposed(d)
    assert type(t) is type(d) and t.shape == (5, 3) and t.strides == (4, 20) and t.gpu_data is memory
    view = backend.transposed(t)
    assert view.shape == (3, 5) and view.strides == (20, 4) and view.gpu_data is memory
    with pytest.raises(ValueError, match="transposed: a 2-D array"):
        backend.transposed(devicearray.DeviceNDArray((4,), (4,), np.float32, gpu_data=memory))


def test_the_gpu_paths_never_transpose_with_numbas_dot_t():
    """Every transpose of a device array in the GPU paths goes through backend.transposed: Numba's .T
    would compile a kernel and copy the array at every call (and a result written through it would be
    lost)."""
    import pathlib
    import re

    root = pathlib.Path(backend.__file__).resolve().parents[1]
    files = [*root.glob("ops/gpu_*.py"), *root.glob("algos/*_cuda.py"), root / "backends" / "cuda.py"]
    assert len(files) >= 5
    for f in files:
        code = "\n".join(line.split("#", 1)[0] for line in f.read_text().splitlines())
        code = re.sub(r'"""(.|\n)*?"""', "", code)
        assert not re.search(r"\.T\b", code.replace("return d.T", "")), f"{f.name} uses .T on an array"
