"""The GPU path of gemm, linear and linear_backward (dense.py): the same calls given GPU arrays.

Arguments are checked as on the CPU (errors name the operator and the argument), viewed as Numba device
arrays without a copy (backends/cuda.py), and run by the plan dispatch makes for the problem with
device="cuda", on the caller's stream. Results are arrays of the caller's library (CuPy, PyTorch or
Numba) on the same device; outputs given (c, accumulate_into) are updated in place and returned.
"""
from __future__ import annotations

import math

from ..algos import gemm_cuda as _fc
from ..backends import cuda as _cuda, device_of
from .._checks import (
    _DTYPE_NAMES, _activation, _flag, _linear_backward_shapes, _new_problem, _same_dtype as _checks_same_dtype,
    _scalar,
)
from ..dispatch import plan as _dispatch_plan
from ..problem import GemmProblem


def _on_gpu(op: str, **arrays) -> None:
    """TypeError when a host array is among arrays (the GPU path has them all on the device)."""
    host = [k for k, v in arrays.items() if device_of(v) == "cpu"]
    if host:
        gpu = [k for k, v in arrays.items() if device_of(v) == "cuda"]
        raise TypeError(f"{op}: arrays on different devices ({', '.join(host)} on the host; {', '.join(gpu)} on "
                        f"the GPU (CUDA)); pass all of a call's arrays on one device")


def _plan(op, p, algo):
    try:
        return _dispatch_plan(p, algo)
    except (TypeError, ValueError) as e:
        msg = str(e)
        if op == p.op or not msg.startswith(f"{p.op}: "):
            raise
        raise type(e)(f"{op}: {msg[len(p.op) + 2:]}") from None


def _check_out(op: str, name: str, d, shape, dtype: str) -> None:
    if _cuda.dtype_name(d) != dtype:
        raise TypeError(f"{op}: {name} must have dtype {dtype}, got {d.dtype}")
    if tuple(d.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(d.shape)}")


def _same_dtype(op: str, **arrays) -> str:
    """_checks._same_dtype (its errors, naming the arrays) for device arrays: the shared dtype's name."""
    return _DTYPE_NAMES[_checks_same_dtype(op, **arrays)]


def _rows(op: str, name: str, d, cols: int):
    """d (..., cols) as a (rows, cols) view; ValueError when it cannot be viewed so without a copy."""
    if d.ndim == 2:
        return d
    rows = math.prod(tuple(d.shape)[:-1])
    try:
        return d.reshape(rows, cols)
    except Exception:  # noqa: BLE001 - Numba cannot view a non-contiguous array with fewer dimensions
        raise ValueError(f"{op}: {name} of shape {tuple(d.shape)} must be C-contiguous on the GPU to be viewed as "
                         f"{rows} x {cols} rows") from None


# ------------------------------------------------------------------------------------------------- gemm
def gemm_prepare(a, b, c, alpha, beta, trans_a, trans_b):
    op = "gemm"
    _on_gpu(op, a=a, b=b, c=c)
    da = _cuda.adopt(op, "a", a, ndim=2)
    db = _cuda.adopt(op, "b", b, ndim=2)
    dtype = _same_dtype(op, a=da, b=db)
    alpha = _scalar(op, "alpha", alpha)
    beta = _scalar(op, "beta", beta)
    A = _cuda.transposed(da) if _flag(op, "trans_a", trans_a) else da
    B = _cuda.transposed(db) if _flag(op, "trans_b", trans_b) else db
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"gemm: inner dimensions differ: op(a) is {A.shape[0]}x{A.shape[1]}, op(b) is "
                         f"{B.shape[0]}x{B.shape[1]}")
    m, k = A.shape
    n = B.shape[1]
    dc = None
    if c is None:
        if beta != 0.0:
            raise ValueError("gemm: beta is nonzero but c is None; pass c to accumulate into")
    else:
        dc = _cuda.adopt(op, "c", c)
        _check_out(op, "c", dc, (m, n), dtype)
    p = _new_problem(op, GemmProblem, m, n, k, trans_a=bool(trans_a), trans_b=bool(trans_b), dtype=dtype,
                     device="cuda")
    return p, A, B, dc, alpha, beta


def gemm(a, b, c, alpha, beta, trans_a, trans_b, algo, stream):
    p, A, B, dc, alpha, beta = gemm_prepare(a, b, c, alpha, beta, trans_a, trans_b)
    plan = _plan("gemm", p, algo)
    s = _cuda.stream_for("gemm", stream, a, b, c)
    if c is None:
        c, dc = _cuda.empty("gemm", a, (p.m, p.n), p.dtype, s)
        if alpha == 0.0 or p.k == 0:
            _scale(dc, p, 0.0, s)
            return c
    elif alpha == 0.0:
        _scale(dc, p, beta, s)
        return c
    plan.run(A, B, out=dc, alpha=alpha, beta=beta, stream=s)
    return c


def _scale(d, p, beta, s):
    """d := beta * d, d not read when beta == 0: the GEMM of an empty depth (k = 0) with alpha = 0."""
    q = GemmProblem(p.m, p.n, 0, dtype=p.dtype, device="cuda")
    if p.m and p.n:
        _dispatch_plan(q, "gemm_tiled_32x32").run(d[:, :0], d[:0, :], out=d, alpha=0.0, beta=beta, stream=s)


# ----------------------------------------------------------------------------------------------- linear
def linear_prepare(x, weight, bias, activation):
    op = "linear"
    _on_gpu(op, input=x, weight=weight, bias=bias)
    dx = _cuda.adopt(op, "input", x)
    if dx.ndim < 1:
        raise ValueError(f"linear: input must have at least 1 dimension, got shape {tuple(dx.shape)}")
    dw = _cuda.adopt(op, "weight", weight, ndim=2)
    db = None if bias is None else _cuda.adopt(op, "bias", bias, ndim=1)
    dtype = _same_dtype(op, input=dx, weight=dw, bias=db)
    out_f, in_f = dw.shape
    if tuple(dx.shape)[-1] != in_f:
        raise ValueError(f"linear: input has {tuple(dx.shape)[-1]} features (last dimension of shape {tuple(dx.shape)}) but "
                         f"weight {tuple(dw.shape)} expects {in_f}")
    if db is not None and tuple(db.shape)[0] != out_f:
        raise ValueError(f"linear: bias must have {out_f} elements (weight rows), got {tuple(db.shape)[0]}")
    act = _activation(op, activation)
    lead = tuple(tuple(dx.shape)[:-1])
    m = math.prod(lead)
    p = _new_problem(op, GemmProblem, m, out_f, in_f, trans_a=False, trans_b=True, dtype=dtype, bias=db is not None,
                     activation=act, device="cuda")
    return p, dx, dw, db, lead


def linear(x, weight, bias, activation, return_preactivation, algo, stream):
    op = "linear"
    p, dx, dw, db, lead = linear_prepare(x, weight, bias, activation)
    _flag(op, "return_preactivation", return_preactivation)
    plan = _plan(op, p, algo)
    s = _cuda.stream_for(op, stream, x, weight, bias)
    x2 = _rows(op, "input", dx, p.k)
    y, dy = _cuda.empty(op, x, lead + (p.n,), p.dtype, s)
    y2 = _rows(op, "output", dy, p.n)
    if not return_preactivation:
        plan.run(x2, _cuda.transposed(dw), out=y2, bias=db, stream=s)
        return y
    z, dz = _cuda.empty(op, x, lead + (p.n,), p.dtype, s)
    z2 = _rows(op, "preactivation", dz, p.n)
    if p.activation == "identity":
        plan.run(x2, _cuda.transposed(dw), out=y2, bias=db, stream=s)
        _cuda.copy(dz, dy, s)
        return y, z
    pz = GemmProblem(p.m, p.n, p.k, trans_a=False, trans_b=True, dtype=p.dtype, bias=p.bias, device="cuda")
    _plan(op, pz, plan.algorithm.name).run(x2, _cuda.transposed(dw), out=z2, bias=db, stream=s)
    if p.m and p.n:
        _fc.activation_forward(z2, y2, p.activation, s)
    return y, z

def linear_backward(grad_output, input, weight, bias, activation, output, preactivation, algo, accumulate_into,
                    stream):
    op = "linear_backward"
    into = accumulate_into if isinstance(accumulate_into, (list, tuple)) else ()
    _on_gpu(op, grad_output=grad_output, input=input, weight=weight, output=output, preactivation=preactivation,
            **{f"accumulate_into[{i}]": v for i, v in enumerate(into)})
    dx = _cuda.adopt(op, "input", input)
    dw = _cuda.adopt(op, "weight", weight, ndim=2)
    dgy = _cuda.adopt(op, "grad_output", grad_output)
    out_f, in_f, expect = _linear_backward_shapes(op, dx.shape, dw.shape, dgy.shape)
    dtype = _same_dtype(op, grad_output=dgy, input=dx, weight=dw)
    act = _activation(op, activation)
    _flag(op, "bias", bias)
    saved = {}
    for name, arr in (("output", output), ("preactivation", preactivation)):
        if arr is not None:
            d = _cuda.adopt(op, name, arr)
            _check_out(op, name, d, expect, dtype)
            saved[name] = d
    into_w = into_b = None
    if accumulate_into is not None:
        if not isinstance(accumulate_into, (list, tuple)) or len(accumulate_into) != 2:
            raise TypeError(f"{op}: accumulate_into must be a pair (grad_weight, grad_bias)")
        into_w = _cuda.adopt(op, "accumulate_into[0]", accumulate_into[0])
        _check_out(op, "accumulate_into[0]", into_w, (out_f, in_f), dtype)
        if bias:
            into_b = _cuda.adopt(op, "accumulate_into[1]", accumulate_into[1])
            _check_out(op, "accumulate_into[1]", into_b, (out_f,), dtype)
        elif accumulate_into[1] is not None:
            raise ValueError(f"{op}: accumulate_into[1] must be None when bias is False")
    s = _cuda.stream_for(op, stream, grad_output, input, weight, output, preactivation, *into)
    m = math.prod(tuple(dx.shape)[:-1])
    x2 = _rows(op, "input", dx, in_f)
    gy2 = _rows(op, "grad_output", dgy, out_f)
    if act == "identity":
        gz = gy2
    else:
        if "preactivation" not in saved and ("output" not in saved or act == "gelu"):
            need = "preactivation" if act == "gelu" else "output or preactivation"
            raise ValueError(f"{op}: activation {act!r} needs the forward's {need}")
        v_is_z = "preactivation" in saved
        v = _rows(op, "preactivation" if v_is_z else "output", saved["preactivation" if v_is_z else "output"], out_f)
        _, gz = _cuda.empty(op, None, (m, out_f), dtype, s)
        if m and out_f:
            _fc.activation_backward(gy2, v, gz, act, v_is_z, s)
    p_dx = _new_problem(op, GemmProblem, m, in_f, out_f, dtype=dtype, device="cuda")
    gx, dgx = _cuda.empty(op, input, tuple(dx.shape), dtype, s)
    _run_gemm(op, p_dx, algo, gz, dw, _rows(op, "grad_input", dgx, in_f), 0.0, s)
    p_dw = _new_problem(op, GemmProblem, out_f, in_f, m, trans_a=True, dtype=dtype, device="cuda")
    if into_w is None:
        gw, dgw = _cuda.empty(op, weight, (out_f, in_f), dtype, s)
    else:
        gw, dgw = accumulate_into[0], into_w
    _run_gemm(op, p_dw, algo, _cuda.transposed(gz), x2, dgw, 0.0 if into_w is None else 1.0, s)
    gb = None
    if bias:
        if into_b is None:
            gb, dgb = _cuda.empty(op, weight, (out_f,), dtype, s)
        else:
            gb, dgb = accumulate_into[1], into_b
        if out_f:
            _fc.column_sums(gz, dgb, into_b is not None, s)
    return gx, gw, gb


def _run_gemm(op, p, algo, a, b, out, beta, s):
    """out := a @ b + beta * out, an empty depth (m = 0 rows of input) writing beta * out."""
    if p.m == 0 or p.n == 0:
        return
    if p.k == 0:
        _scale(out, p, beta, s)
        return
    _plan(op, p, algo).run(a, b, out=out, beta=beta, stream=s)
