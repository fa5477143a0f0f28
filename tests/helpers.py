"""Helpers shared by the tests: dtypes and tolerances, memory layouts of one logical array, ukernel geometry."""
from __future__ import annotations

import numpy as np

import dnnkit
from dnnkit.autotune.records import TuneRecord, TuneResult
from dnnkit.problem import ConvProblem

DTYPES = (np.float32, np.float64)
FLOAT64_TOL = 1e-12  # relative L2 bound for float64 (Algorithm.tolerance is the float32 bound)
SENTINEL = -7777.25  # fills memory around outputs; exactly representable in float32 and float64


def tolerance(algo, dtype) -> float:
    """Relative L2 error bound for algo's output in dtype."""
    return algo.tolerance if np.dtype(dtype) == np.float32 else FLOAT64_TOL


def dtype_tolerance(dtype) -> float:
    """Bound for operators that pick their algorithm themselves (linear): the loosest registered one."""
    algos = dnnkit.algos.algorithms("gemm", "cpu")
    return max(tolerance(a, dtype) for a in algos)


def ukernel_geometry(isa: str, dtype) -> dict:
    name, mr, nr, mc, kc, nc = dnnkit._cpu.ukernel_info(isa, np.dtype(dtype).itemsize)
    return {"name": name, "MR": mr, "NR": nr, "MC": mc, "KC": kc, "NC": nc}


# Layouts of a 2-D array: the same values, different strides.
#   C: row-major; F: column-major; strided: every 2nd row and 3rd column of a larger buffer;
#   reversed: negative strides in both dimensions.
LAYOUTS = ("C", "F", "strided", "reversed")


def with_layout(x: np.ndarray, layout: str, fill=np.nan):
    """(view, buffer): a view holding x's values in `layout`, and the buffer it lives in. Elements of the
    buffer outside the view hold `fill` (NaN by default, so a kernel that reads outside its view fails)."""
    r, c = x.shape
    if layout in ("C", "F"):
        v = np.array(x, order=layout)  # always a copy
        return v, v
    if layout == "strided":
        buf = np.full((2 * r + 1, 3 * c + 2), fill, dtype=x.dtype)
        v = buf[1::2, 2::3][:r, :c]  # (r, c) view, strides (2 rows, 3 columns)
    elif layout == "reversed":
        buf = np.full((r + 2, c + 2), fill, dtype=x.dtype)
        v = buf[1:1 + r, 1:1 + c][::-1, ::-1]  # (r, c) view, negative strides
    else:
        raise ValueError(layout)
    v[...] = x
    assert v.shape == x.shape
    return v, buf


def untouched_outside(view: np.ndarray, buf: np.ndarray, fill) -> bool:
    """True when every element of buf outside view still holds fill (NaN-aware). Overwrites view."""
    view[...] = fill
    return bool(np.isnan(buf).all()) if np.isnan(fill) else bool((buf == fill).all())


def central_differences(loss, a, step: float = 1e-6) -> np.ndarray:
    """d loss() / d a by central differences, perturbing each element of the float64 array a in place
    (restored afterwards); loss reads a."""
    numeric = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        keep = a[idx]
        a[idx] = keep + step
        plus = loss()
        a[idx] = keep - step
        minus = loss()
        a[idx] = keep
        numeric[idx] = (plus - minus) / (2 * step)
    return numeric


def rnn_param_names(layers: int, directions: int, bias: bool, proj: bool = False) -> list:
    """The parameter names of a torch.nn.LSTM/GRU/RNN module, in its order (weight_hr with projections)."""
    names = []
    for layer in range(layers):
        for suffix in ("", "_reverse")[:directions]:
            names += [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}"]
            if bias:
                names += [f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
            if proj:
                names.append(f"weight_hr_l{layer}{suffix}")
    return names


def rnn_user_layout(c, x, h0, c0, weights, names):
    """Time-major batched RNN arrays in the layout a case asks dnnkit for: unbatched (batch 1 dropped) or
    batch_first, and the weights as a dict keyed by names when c.as_dict."""
    if c.unbatched:
        x = x[:, 0]
        h0 = None if h0 is None else h0[:, 0]
        c0 = None if c0 is None else c0[:, 0]
    elif c.batch_first:
        x = x.transpose(1, 0, 2)
    return x, h0, c0, (dict(zip(names, weights)) if c.as_dict else weights)


def amx_set(on: bool):
    """A fixture's body: set_amx(on) for the test, then the previous setting back."""
    previous = dnnkit.get_amx()
    dnnkit.set_amx(on)
    try:
        yield
    finally:
        dnnkit.set_amx(previous)


# A tuning result to store (the cache tests): `best` measured at t seconds, FFT pruned.
CACHED_PROBLEM = ConvProblem.parse("mb2ic8ih12oc8oh12kh3ph1")


def cached_result(p=CACHED_PROBLEM, best="direct", t=1e-3):
    return TuneResult(p, [TuneRecord(best, "ok", median_s=t, workspace_bytes=0),
                          TuneRecord("fft", "pruned", reason="predicted slow")], 0.5)


def run_each_operator(n: int = 4):
    """One small gemm, conv2d and lstm, their results checked: what must keep working whatever the tuning
    cache's state."""
    assert dnnkit.gemm(np.ones((n, n), np.float32), np.ones((n, n), np.float32))[0, 0] == n
    assert dnnkit.conv2d(np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)).shape == (1, 3, 3, 3)
    out, _ = dnnkit.lstm(np.ones((2, 1, 3), np.float32), None, None,
                         [np.full((8, 3), 0.1, np.float32), np.full((8, 2), 0.1, np.float32)])
    assert out.shape == (2, 1, 2)
