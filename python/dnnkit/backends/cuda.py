"""The CUDA backend: device arrays (anything with __cuda_array_interface__, or CUDA DLPack), Numba-CUDA
kernels (dnnkit.kernels), CUDA events for timing, the GPU's fingerprint.

Nothing here imports numba or CuPy until asked: `import dnnkit` stays as fast with them installed as
without, and works where they are not."""
from __future__ import annotations

import functools
import importlib
import os
import time

import numpy as np

_FLOATS = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}


def simulator() -> bool:
    """Whether Numba's CUDA simulator stands in for the GPU (NUMBA_ENABLE_CUDASIM=1): kernels run on the
    CPU, one Python thread per GPU thread, for tests."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def is_device_array(x) -> bool:
    """An array on a CUDA device: __cuda_array_interface__, the simulator's device arrays (which have
    no interface and convert to NumPy), or a weight pack_weight copied on the GPU."""
    return hasattr(x, "__cuda_array_interface__") or type(x).__name__ in ("FakeCUDAArray", "GpuPackedWeight")


@functools.lru_cache(maxsize=None)
def status() -> dict:
    """Whether a CUDA GPU can run dnnkit's GPU kernels here, and why not: {"available": bool, "reason":
    str | None, "devices": [{"name", "compute_capability", "memory_bytes", "sm_count"}], "driver": str}.
    Asks once per process (importing numba-cuda and initialising the driver)."""
    try:
        from numba import cuda
    except Exception as e:  # noqa: BLE001 - numba-cuda missing or broken: the GPU path is unavailable
        return {"available": False, "reason": f"numba-cuda is not installed ({type(e).__name__}: {e}); "
                                              f"pip install \"dnnkit[cuda]\"", "devices": [], "driver": None}
    if simulator():
        return {"available": False, "reason": "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) stands in for a GPU: "
                                              "the kernels run on the CPU, and there is no device to report",
                "devices": [], "driver": None}
    try:  # the kernel compiler's own modules: they fail to load where numba-cuda and NumPy do not match
        importlib.import_module("numba.cuda.cudaimpl")
    except Exception as e:  # noqa: BLE001 - any failure here means no kernel can be compiled
        import numpy

        return {"available": False, "reason": f"numba-cuda cannot compile kernels with NumPy {numpy.__version__} "
                                              f"({type(e).__name__}: {e}); install versions that match",
                "devices": [], "driver": None}
    try:
        if not cuda.is_available():
            return {"available": False, "reason": "no CUDA driver or GPU found", "devices": [], "driver": None}
        devices = []
        for d in cuda.list_devices():
            with d:
                dev = cuda.get_current_device()
                name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                free, total = cuda.current_context().get_memory_info()
                info = {"name": name, "compute_capability": "%d.%d" % dev.compute_capability,
                        "memory_bytes": int(total), "sm_count": int(dev.MULTIPROCESSOR_COUNT)}
                try:
                    info.update(clock_khz=int(dev.CLOCK_RATE), memory_clock_khz=int(dev.MEMORY_CLOCK_RATE),
                                memory_bus_bits=int(dev.GLOBAL_MEMORY_BUS_WIDTH),
                                shared_optin_bytes=int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
                except Exception:  # noqa: BLE001 - a driver that does not report them
                    pass
                devices.append(info)
        ver = cuda.cudadrv.driver.driver.get_version()
        return {"available": True, "reason": None, "devices": devices, "driver": ".".join(map(str, ver))}
    except Exception as e:  # noqa: BLE001 - a driver that fails to initialise: the GPU path is unavailable
        return {"available": False, "reason": f"the CUDA driver failed ({type(e).__name__}: {e})", "devices": [],
                "driver": None}


# Per SM and clock, by compute capability: float32 FMA lanes, and dense TF32 tensor-core FLOP (published
# figures: A100 156 TFLOP/s TF32 on 108 SMs at 1.41 GHz; H100 SXM 495 on 132 at 1.83 GHz; the sm_86/89
# parts a quarter of sm_90's a clock).
_FP32_LANES = {"8.0": 64, "8.6": 128, "8.7": 128, "8.9": 128, "9.0": 128}
_TF32_PER_CLOCK = {"8.0": 1024, "8.6": 512, "8.7": 512, "8.9": 512, "9.0": 2048}


def ceilings(device: int = 0) -> dict | None:
    """The GPU's nominal ceilings from its attributes: {"fp32_flops", "tf32_flops", "bytes_per_s"} (peak
    FMA rate at the boost clock, dense TF32 tensor-core rate, DRAM bandwidth: memory clock x bus width x
    2 for double data rate); None without a GPU or for an architecture not in the table. What the
    benchmarks' fraction of the peak divides by."""
    s = status()
    if not s["available"] or len(s["devices"]) <= device or "clock_khz" not in s["devices"][device]:
        return None
    d = s["devices"][device]
    cc = d["compute_capability"]
    if cc not in _FP32_LANES:
        return None
    clock = d["clock_khz"] * 1e3
    return {"fp32_flops": 2.0 * _FP32_LANES[cc] * d["sm_count"] * clock,
            "tf32_flops": float(_TF32_PER_CLOCK[cc]) * d["sm_count"] * clock,
            "bytes_per_s": 2.0 * d["memory_clock_khz"] * 1e3 * d["memory_bus_bits"] / 8}


def measure_ceilings(seconds: float = 0.02, copy_bytes: int = 256 << 20, repeats: int = 3) -> dict:
    """The GPU's float32 FMA rate and copy bandwidth, measured (CUDA events, best of `repeats`):
    {"fp32_flops", "bytes_per_s"}. The rate: kernels/probe.py's FMA chains on 8 blocks of 256 threads an
    SM, sized to run about `seconds`; the bandwidth: a device-to-device copy of copy_bytes (bytes read
    plus bytes written, over the time)."""
    import numpy as np

    from dnnkit.kernels import probe

    cuda = _cuda()
    sms = 1 if simulator() else max(1, int(status()["devices"][0]["sm_count"]))
    blocks = sms * (1 if simulator() else 8)
    threads = blocks * probe.THREADS
    out = cuda.device_array(threads, np.float32)
    kern = probe.fma_peak("float32")
    a, b = np.float32(0.999), np.float32(1e-3)
    stream = cuda.default_stream()
    n = probe.UNROLL * 4
    best = 0.0
    for _ in range(8):  # grow n until a launch takes a quarter of `seconds`, then time it
        t = time_call(lambda: launch(kern, blocks, probe.THREADS, stream, out, n, a, b), stream)
        if t >= seconds / 4 or simulator():
            break
        n = max(n * 2, int(n * seconds / max(t, 1e-7)) // probe.UNROLL * probe.UNROLL)
    for _ in range(repeats):
        t = time_call(lambda: launch(kern, blocks, probe.THREADS, stream, out, n, a, b), stream)
        best = max(best, 2.0 * probe.CHAINS * n * threads / t)
    elems = max(1, copy_bytes // 4)
    src, dst = cuda.device_array(elems, np.float32), cuda.device_array(elems, np.float32)
    bandwidth = 0.0
    for _ in range(repeats):
        t = time_call(lambda: copy(dst, src, stream), stream)
        bandwidth = max(bandwidth, 2.0 * elems * 4 / t)
    return {"fp32_flops": best, "bytes_per_s": bandwidth}


# A nominal H100 (132 SMs, 227 KiB of shared memory a block), for sizing where no GPU can be asked.
_NOMINAL_RESIDENT = (132, 227 * 1024)


def resident_limits(device: int = 0) -> tuple[int, int]:
    """(blocks, shared bytes a block) for a grid whose blocks must all be resident at once, one an SM:
    the device's SM count and opt-in shared memory a block; one block under the simulator (which runs
    blocks one after another); a nominal H100's without a GPU."""
    if simulator():
        return 1, _NOMINAL_RESIDENT[1]
    s = status()
    if not s["available"] or len(s["devices"]) <= device:
        return _NOMINAL_RESIDENT
    d = s["devices"][device]
    return d["sm_count"], d.get("shared_optin_bytes", DEFAULT_SHARED_BYTES)


def fingerprint() -> str:
    """What a GPU tuning record is valid for: the device's name, compute capability, SM count, the driver
    and numba-cuda's version (the kernels' compiler); 'cuda|unavailable' (matching no record) without a
    usable GPU, 'cuda|simulator' under the simulator."""
    if simulator():
        return "cuda|simulator"
    s = status()
    if not s["available"] or not s["devices"]:
        return "cuda|unavailable"
    d = s["devices"][0]
    try:
        from importlib.metadata import version

        compiler = version("numba-cuda")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        compiler = "unknown"
    return (f"cuda|{d['name']}|sm{d['compute_capability']}|{d['sm_count']}sm|driver{s['driver']}"
            f"|numba-cuda{compiler}")


def _cuda():
    from numba import cuda

    return cuda


def _unavailable(op: str) -> None:
    s = status()
    if not s["available"]:
        raise RuntimeError(f"{op}: GPU arrays given but the GPU backend is unavailable: {s['reason']}")


def adopt(op: str, name: str, x, ndim=None):
    """x as a Numba device array over the same memory (no copy): anything with __cuda_array_interface__
    (CuPy, PyTorch CUDA tensors, Numba), a CUDA DLPack tensor (through CuPy), or the simulator's arrays.
    TypeError/ValueError naming op and name for anything else, another dtype than float32/float64, or
    another rank than ndim (an int or a tuple of them)."""
    if x is None:
        raise TypeError(f"{op}: {name} must be an array, got None")
    if type(x).__name__ == "GpuPackedWeight":  # pack_weight of a GPU array: its copy
        x = x.packed
    if type(x).__name__ == "FakeCUDAArray":
        d = x
    elif hasattr(x, "__cuda_array_interface__"):
        _unavailable(op)
        d = _cuda().as_cuda_array(x, sync=False)  # ordered on the GPU instead: stream_for, after
    elif hasattr(x, "__dlpack_device__"):
        _unavailable(op)
        try:
            import cupy
        except ImportError:
            raise TypeError(f"{op}: {name} is a CUDA DLPack tensor without __cuda_array_interface__; dnnkit "
                            f"takes those through CuPy, which is not installed") from None
        d = _cuda().as_cuda_array(cupy.from_dlpack(x), sync=False)
    else:
        raise TypeError(f"{op}: {name} must be an array on the GPU like the others, got {type(x).__name__}")
    if np.dtype(d.dtype) not in _FLOATS:
        raise TypeError(f"{op}: {name} must have dtype float32 or float64, got {d.dtype}")
    if ndim is not None and d.ndim not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        want = " or ".join(f"{n}-D" for n in (ndim if isinstance(ndim, tuple) else (ndim,)))
        raise ValueError(f"{op}: {name} must be {want}, got shape {tuple(d.shape)}")
    return d


def transposed(d):
    """The transpose of the 2-D device array d as a view of the same memory. (Numba's DeviceNDArray.T is
    not a view: it copies d through a transpose kernel, which it compiles anew at every call.)"""
    if type(d).__name__ == "FakeCUDAArray":  # the simulator's arrays are NumPy arrays: .T is a view
        return d.T
    if d.ndim != 2:
        raise ValueError(f"transposed: a 2-D array is needed, got shape {tuple(d.shape)}")
    return type(d)(shape=tuple(d.shape)[::-1], strides=tuple(d.strides)[::-1], dtype=d.dtype, stream=d.stream,
                   gpu_data=d.gpu_data)


def dtype_name(d) -> str:
    return _FLOATS[np.dtype(d.dtype)]


def _library(x) -> str:
    mod = type(x).__module__.split(".")[0]
    return mod if mod in ("cupy", "torch") else "numba"


def stream_for(op: str, stream, *arrays):
    """The Numba stream a call runs on: stream= when given (a Numba, CuPy or PyTorch stream, or a raw
    cudaStream_t as an int), else the current stream of the caller's library (CuPy's, PyTorch's), else the
    default stream; ordered after the streams the arrays (every operand of the call) were written on."""
    cuda = _cuda()
    if simulator():
        return cuda.default_stream()
    if stream is None:
        libs = {_library(a) for a in arrays if a is not None and is_device_array(a)}
        if "cupy" in libs:
            import cupy

            stream = cupy.cuda.get_current_stream()
        elif "torch" in libs:
            import torch

            stream = torch.cuda.current_stream()
        else:
            stream = 0
    if hasattr(stream, "handle") and type(stream).__module__.startswith("numba"):
        s = stream
    else:
        handle = stream if isinstance(stream, int) else getattr(stream, "ptr", getattr(stream, "cuda_stream", None))
        if not isinstance(handle, int):
            raise TypeError(f"{op}: stream must be a Numba, CuPy or PyTorch stream or an int handle, got "
                            f"{type(stream).__name__}")
        s = cuda.default_stream() if handle == 0 else cuda.external_stream(handle)
    after(s, *arrays)
    return s


def _stream_key(handle: int) -> int:
    """A stream handle with the legacy default stream's two names (0 and CU_STREAM_LEGACY, 1) made one."""
    return 1 if handle in (0, 1) else handle


def after(s, *arrays) -> None:
    """Orders stream s after the work queued so far on each stream an array says it was written on (its
    __cuda_array_interface__ "stream", version 3) when that is another stream: an event recorded there that
    s waits on, so the host never waits (Numba's own import synchronizes the host with that stream
    instead). Arrays without a stream (PyTorch's, which stay on the caller's current stream, and Numba's
    on the default stream) and the simulator's need nothing."""
    handles = []
    for a in arrays:
        if type(a).__name__ == "GpuPackedWeight":
            a = a.packed
        iface = getattr(a, "__cuda_array_interface__", None)
        handles.append(iface.get("stream") if isinstance(iface, dict) else None)
    _after_streams(s, handles)


def _after_streams(s, handles) -> None:
    """Orders stream s after the work queued so far on the streams with these handles (None: none)."""
    if simulator():
        return
    h = s.handle
    seen = {_stream_key(int(getattr(h, "value", h) or 0))}  # a driver-binding CUstream, a ctypes pointer or an int
    for handle in handles:
        if handle is None or _stream_key(handle) in seen:
            continue
        seen.add(_stream_key(handle))
        wait(signal(_cuda().external_stream(handle)), s)


def empty(op: str, like, shape, dtype: str, stream):
    """A new array of shape and dtype on like's device, of like's library (CuPy, PyTorch, else Numba):
    (the caller's object, a Numba view of it)."""
    shape = tuple(int(s) for s in shape)
    try:
        lib = _library(like)
        if lib == "cupy":
            import cupy

            out = cupy.empty(shape, dtype=dtype)  # from CuPy's pool for its current stream: stream runs after it
            after(stream, out)
            return out, _cuda().as_cuda_array(out, sync=False)
        if lib == "torch":
            import torch

            out = torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)  # likewise, from torch's
            _after_streams(stream, [torch.cuda.current_stream(like.device).cuda_stream])
            return out, _cuda().as_cuda_array(out, sync=False)
        out = _cuda().device_array(shape, dtype=dtype, stream=stream)
        return out, out
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a device allocation failure is reported as one, naming op
        if "memory" in str(e).lower():
            raise MemoryError(f"{op}: cannot allocate an output of shape {shape} on the GPU ({e})") from None
        raise


def upload(host, stream):
    """A Numba device array holding a copy of the NumPy array host."""
    cuda = _cuda()
    return cuda.to_device(host) if simulator() else cuda.to_device(host, stream=stream)


def scratch(shape, dtype: str, stream):
    """Workspace memory for a kernel, a Numba device array, released when dropped."""
    return _cuda().device_array(tuple(shape), dtype=dtype, stream=stream)


def copy(dst, src, stream) -> None:
    """dst[...] = src, device to device, on stream."""
    if simulator():
        dst.copy_to_device(src)
    else:
        dst.copy_to_device(src, stream=stream)


# Dynamic shared memory a block gets without asking (above it, up to the device's opt-in limit, the
# kernel's attribute must be raised first).
DEFAULT_SHARED_BYTES = 48 * 1024


def launch(kernel, grid, block, stream, *args, shared_bytes: int = 0):
    """kernel[grid, block, stream, shared_bytes](*args) (stream None: the default stream); the simulator
    runs it on the CPU, its stream aside. shared_bytes: the dynamic shared memory of a block."""
    if simulator():
        kernel[grid, block, 0, shared_bytes](*args)
    elif shared_bytes > DEFAULT_SHARED_BYTES:
        _allow_shared(kernel, args, shared_bytes)
        kernel[grid, block, stream if stream is not None else 0, shared_bytes](*args)
    elif stream is None and not shared_bytes:
        kernel[grid, block](*args)
    else:
        kernel[grid, block, stream if stream is not None else 0, shared_bytes](*args)


_SHARED_ALLOWED: dict = {}


def _allow_shared(kernel, args, nbytes: int) -> None:
    """Raise the kernel's (as compiled for args) dynamic shared memory limit to nbytes, once."""
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    if _SHARED_ALLOWED.get(id(compiled), 0) >= nbytes:
        return
    from numba.cuda.cudadrv import driver as drv

    cufunc = compiled._codelibrary.get_cufunc()
    attr = drv.binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    drv.driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
    _SHARED_ALLOWED[id(compiled)] = nbytes


def _event():
    """An event for ordering streams (no timing; the simulator's take no arguments)."""
    return _cuda().event() if simulator() else _cuda().event(timing=False)


def fork(stream, n: int) -> list:
    """n new streams, each ordered after the work already queued on stream (None: the default stream)."""
    cuda = _cuda()
    ev = _event()
    ev.record(stream if stream is not None else cuda.default_stream())
    out = []
    for _ in range(n):
        st = cuda.stream()
        ev.wait(st)
        out.append(st)
    return out


def signal(stream):
    """An event recorded on stream now: what another stream waits on (wait(event, other))."""
    ev = _event()
    ev.record(stream)
    return ev


def wait(event, stream) -> None:
    """stream (None: the default stream) runs nothing queued after this until event has happened."""
    event.wait(stream if stream is not None else _cuda().default_stream())


def join(streams, stream) -> None:
    """stream (None: the default stream) waits for everything queued on streams so far."""
    for st in streams:
        wait(signal(st), stream)


def time_call(fn, stream=None) -> float:
    """Seconds fn()'s GPU work takes on stream (default: the default stream), between two CUDA events
    recorded around it; under the simulator (whose events do not time), the wall time of the call."""
    cuda = _cuda()
    if simulator():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    stream = stream or cuda.default_stream()
    start, end = cuda.event(), cuda.event()
    start.record(stream)
    fn()
    end.record(stream)
    end.synchronize()
    return cuda.event_elapsed_time(start, end) / 1e3


def last_level_cache_bytes() -> int:
    """The GPU's L2 (what the tuner's operand copies must outgrow so that no call finds its inputs where
    the last left them); 50 MiB (an H100's) where it cannot be asked."""
    try:
        dev = _cuda().get_current_device()
        return int(dev.L2_CACHE_SIZE)
    except Exception:  # noqa: BLE001 - the simulator, or no driver
        return 50 * 1024 * 1024


def synchronize(stream=None) -> None:
    if stream is None:
        _cuda().synchronize()
    else:
        stream.synchronize()


def no_kernels(op: str) -> Exception:
    """The error for op called with GPU arrays when dnnkit has no GPU algorithm for it (the operators that
    have one take their GPU arrays to ops/gpu_dense.py and never ask)."""
    return NotImplementedError(f"{op}: GPU arrays given, and dnnkit has no GPU kernels for this operator yet; "
                               f"pass NumPy arrays to run it on the CPU")
