"""gemm, linear and linear_backward on the host: validate -> build a Problem -> dispatch -> run.

Semantics follow BLAS (gemm) and torch.nn.functional (linear). Errors name the operator and argument.
GPU arrays go to gpu_dense.py.
"""
from __future__ import annotations

import math

import numpy as np

from ..algos import gemm_cpu as _fc_kernels
from ..algos.gemm_cpu import ACTIVATION_CODES, LINEAR_RUN_KINDS
from .._checks import (
    _DTYPE_NAMES, _activation, _array, _empty, _flag, _linear_backward_shapes, _new_problem, _output, _same_dtype,
    _scalar, _unshared,
)
from ..backends import DeviceArray, cpu as _cpu, device_of, placement_error
from ..dispatch import dispatch_state, plan as _dispatch_plan
from ..packed import PackedWeight
from ..problem import GemmProblem
from ._common import _accumulate_target, _calls, _gpu, _host_stream, _plan, _problems, _targets_apart


def _gemm_problem(op, m, n, k, trans_a, trans_b, dtype, bias=False, activation="identity",
                  packed=False) -> GemmProblem:
    key = ("gemm", m, n, k, trans_a, trans_b, dtype, bias, activation, packed)
    p = _problems.get(key)
    if p is None:
        p = _problems.put(key, _new_problem(op, GemmProblem, m, n, k, trans_a=trans_a, trans_b=trans_b,
                                            dtype=_DTYPE_NAMES[dtype], bias=bias, activation=activation,
                                            packed=packed))
    return p


# ------------------------------------------------------------------------------------------------- gemm
def _gemm_prepare(a, b, c, alpha, beta, trans_a, trans_b):
    op = "gemm"
    a = _array(op, "a", a, ndim=2)
    b = _array(op, "b", b, ndim=2)
    dtype = a.dtype
    if b.dtype != dtype:
        _same_dtype(op, a=a, b=b)  # raises, naming the arrays
    alpha = _scalar(op, "alpha", alpha)
    beta = _scalar(op, "beta", beta)
    A = a.T if _flag(op, "trans_a", trans_a) else a  # M x K
    B = b.T if _flag(op, "trans_b", trans_b) else b  # K x N
    if A.shape[1] != B.shape[0]:
        raise ValueError(
            f"gemm: inner dimensions differ: op(a) is {A.shape[0]}x{A.shape[1]}, op(b) is {B.shape[0]}x{B.shape[1]}"
        )
    m, k = A.shape
    n = B.shape[1]
    if c is None:
        if beta != 0.0:
            raise ValueError("gemm: beta is nonzero but c is None; pass c to accumulate into")
    else:
        _output(op, "c", c, (m, n), dtype)
    p = _gemm_problem("gemm", m, n, k, bool(trans_a), bool(trans_b), dtype)
    return p, A, B, alpha, beta


def gemm(a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, algo="auto", stream=None):
    """C := alpha * op(a) @ op(b) + beta * C, with op(x) = x.T when trans_x, as BLAS sgemm/dgemm.

    a, b: 2-D float32 or float64 arrays of one dtype, any strides: NumPy arrays (run on the CPU) or GPU
    arrays (CuPy, PyTorch CUDA tensors, Numba device arrays; run on the GPU, on `stream` or the caller's
    current stream). When c is given it is updated in place and returned; when beta == 0 it is not read (it
    may hold NaN), and when alpha == 0 neither are a and b. Without c a new array is returned, of a's kind.
    """
    # A call seen before (_calls: a's and b's shapes and dtypes, the flags, algo) with float alpha and beta,
    # alpha nonzero: c checked, the plan run; the value says whether C is small enough for NumPy's allocator.
    key = None
    if (type(a) is np.ndarray and type(b) is np.ndarray and type(trans_a) is bool and type(trans_b) is bool
            and type(alpha) is float and type(beta) is float and type(algo) is str and stream is None
            and alpha != 0.0):
        key = ("gemm", a.shape, a.dtype, b.shape, b.dtype, trans_a, trans_b, algo,
               dispatch_state())
        hit = _calls.get(key)
        if hit is not None:
            plan, small = hit
            p = plan.problem
            if c is None:
                if beta == 0.0:
                    c = np.empty((p.m, p.n), a.dtype) if small else _empty("gemm", (p.m, p.n), a.dtype)
                    plan.run(a.T if trans_a else a, b.T if trans_b else b, out=c, alpha=alpha, beta=beta)
                    return c
            # c as _output accepts it (a broadcast view, stride 0, aside): else the checks below say why not
            elif (type(c) is np.ndarray and c.shape == (p.m, p.n) and c.dtype == a.dtype and c.flags.writeable
                  and 0 not in c.strides):
                plan.run(_unshared(a.T if trans_a else a, c), _unshared(b.T if trans_b else b, c), out=c,
                         alpha=alpha, beta=beta)
                return c
    try:
        p, A, B, alpha, beta = _gemm_prepare(a, b, c, alpha, beta, trans_a, trans_b)
    except DeviceArray:
        return _gpu("gemm", a=a, b=b, c=c).gemm(a, b, c, alpha, beta, trans_a, trans_b, algo, stream)
    _host_stream("gemm", stream)
    if alpha == 0.0:
        # As BLAS: a and b are not read (a NaN or Inf in them does not reach C); C = beta * C.
        if algo != "auto":
            _dispatch_plan(p, algo)  # a named algorithm is still checked
        if c is None:
            c = _empty("gemm", (p.m, p.n), A.dtype)
            c.fill(0.0)
        elif beta == 0.0:
            c.fill(0.0)
        elif beta != 1.0:
            c *= beta
        return c
    plan = _dispatch_plan(p, algo)
    if c is None:
        c = _empty("gemm", (p.m, p.n), A.dtype)
    else:
        A, B = _unshared(A, c), _unshared(B, c)
    plan.run(A, B, out=c, alpha=alpha, beta=beta)
    if key is not None:
        _calls.put(key, (plan, p.m * p.n * p.itemsize < _cpu.recycle_bytes))
    return c


# ----------------------------------------------------------------------------------------------- linear
def _linear_prepare(x, weight, bias, activation):
    op = "linear"
    x = _array(op, "input", x)
    if x.ndim < 1:
        raise ValueError(f"linear: input must have at least 1 dimension, got shape {x.shape}")
    w = _array(op, "weight", weight, ndim=2)
    if bias is not None:
        bias = _array(op, "bias", bias, ndim=1)
    dtype = x.dtype
    if w.dtype != dtype or (bias is not None and bias.dtype != dtype):
        _same_dtype(op, input=x, weight=w, bias=bias)  # raises, naming the arrays
    out_f, in_f = w.shape
    if x.shape[-1] != in_f:
        raise ValueError(
            f"linear: input has {x.shape[-1]} features (last dimension of shape {x.shape}) but weight "
            f"{w.shape} expects {in_f}"
        )
    if bias is not None and bias.shape[0] != out_f:
        raise ValueError(f"linear: bias must have {out_f} elements (weight rows), got {bias.shape[0]}")
    act = _activation(op, activation)
    lead = x.shape[:-1]
    m = math.prod(lead)
    p = _gemm_problem(op, m, out_f, in_f, False, True, dtype, bias is not None, act)
    return p, x.reshape(m, in_f), w, bias, lead


def _linear_key(input, weight, bias, activation, algo):
    """A call's signature in _calls: what its checks and dispatch depend on. A hit (the batch-1 layer of an
    inference loop) holds (plan, the linear_run kernel that does what the plan's algorithm does, or None),
    and with a kernel goes straight to it: the output allocated, the kernel run, all in one C++ call; on a
    weight packed by pack_weight it holds the activation's code for linear_prepacked."""
    packed = type(weight) is PackedWeight
    if not (type(input) is np.ndarray and (packed or type(weight) is np.ndarray)
            and (bias is None or type(bias) is np.ndarray) and (activation is None or type(activation) is str)
            and type(algo) is str):
        return None
    return ("linear", input.shape, input.dtype, packed, weight.shape, weight.dtype,
            None if bias is None else (bias.shape, bias.dtype), activation, algo,
            dispatch_state())


def linear(input, weight, bias=None, *, activation=None, return_preactivation=False, algo="auto", stream=None):
    """y = act(input @ weight.T + bias), as torch.nn.functional.linear followed by the activation.

    input: (..., in_features); weight: (out_features, in_features), or that weight packed once by
    dnnkit.pack_weight (its own kernel: no packing of the weight at each call); bias: (out_features,) or None.
    activation: None, 'relu', 'tanh', 'sigmoid' or 'gelu' (the exact, erf form), fused into the GEMM.
    return_preactivation: also return z = input @ weight.T + bias (what linear_backward needs for gelu).
    GPU arrays run on the GPU (see gemm), on `stream` or the caller's current stream.
    """
    if isinstance(weight, PackedWeight):
        return _linear_packed(input, weight, bias, activation, return_preactivation, algo)
    key = None if return_preactivation is not False else _linear_key(input, weight, bias, activation, algo)
    hit = None if key is None else _calls.get(key)
    if hit is not None:
        plan, kind = hit
        p = plan.problem
        if kind is not None:
            return _fc_kernels.linear_run(input, weight, bias, ACTIVATION_CODES[p.activation], kind)
        y = _empty("linear", input.shape[:-1] + (p.n,), weight.dtype)
        plan.run(input.reshape(p.m, p.k), weight.T, out=y.reshape(p.m, p.n), bias=bias)
        return y
    try:
        p, x2, w, bias, lead = _linear_prepare(input, weight, bias, activation)
    except DeviceArray:
        return _gpu("linear", input=input, weight=weight, bias=bias).linear(
            input, weight, bias, activation, return_preactivation, algo, stream)
    _host_stream("linear", stream)
    _flag("linear", "return_preactivation", return_preactivation)
    plan = _plan("linear", p, algo)
    y = _empty("linear", lead + (p.n,), w.dtype)
    y2 = y.reshape(p.m, p.n)
    if not return_preactivation or p.activation == "identity":
        plan.run(x2, w.T, out=y2, bias=bias)
        if key is not None:
            _calls.put(key, (plan, LINEAR_RUN_KINDS.get(type(plan.algorithm))))
        return (y, y.copy()) if return_preactivation else y
    z = _empty("linear", y.shape, y.dtype)
    pz = _gemm_problem("linear", p.m, p.n, p.k, False, True, w.dtype, p.bias)
    plan.algorithm.run(pz, x2, w.T, out=z.reshape(p.m, p.n), bias=bias)
    _fc_kernels.activation_forward(z, y, ACTIVATION_CODES[p.activation])
    return y, z


def _linear_packed_prepare(x, pw, bias, activation):
    """(problem, x as m x k rows, bias, the output's leading shape) of linear on a weight packed by
    pack_weight, checked."""
    op = "linear"
    try:
        x = _array(op, "input", x)
        if bias is not None:
            bias = _array(op, "bias", bias, ndim=1)
    except DeviceArray:
        raise placement_error(op, input=x, weight=pw.weight, bias=bias) from None
    if x.ndim < 1:
        raise ValueError(f"linear: input must have at least 1 dimension, got shape {x.shape}")
    if x.dtype != pw.dtype or (bias is not None and bias.dtype != pw.dtype):
        _same_dtype(op, input=x, weight=pw.weight, bias=bias)  # raises, naming the arrays
    out_f, in_f = pw.shape
    if x.shape[-1] != in_f:
        raise ValueError(f"linear: input has {x.shape[-1]} features (last dimension of shape {x.shape}) but the "
                         f"packed weight {pw.shape} expects {in_f}")
    if bias is not None and bias.shape[0] != out_f:
        raise ValueError(f"linear: bias must have {out_f} elements (weight rows), got {bias.shape[0]}")
    act = _activation(op, activation)
    m = math.prod(x.shape[:-1])
    p = _gemm_problem(op, m, out_f, in_f, False, True, x.dtype, bias is not None, act, packed=True)
    return p, x.reshape(m, in_f), bias, x.shape[:-1]


def _linear_packed(x, pw, bias, activation, return_preactivation, algo):
    """linear on a weight packed by pack_weight: dispatch finds gemm_prepacked, the one algorithm that
    reads a packed weight."""
    op = "linear"
    key = None if return_preactivation is not False else _linear_key(x, pw, bias, activation, algo)
    act_code = None if key is None else _calls.get(key)
    if act_code is not None:  # checked and dispatched before
        return _fc_kernels.linear_prepacked(x, pw, bias, act_code)
    p, x2, bias, lead = _linear_packed_prepare(x, pw, bias, activation)
    _flag(op, "return_preactivation", return_preactivation)
    y = _empty(op, lead + (p.n,), x2.dtype)
    if not return_preactivation or p.activation == "identity":
        _plan(op, p, algo).run(x2, pw, out=y.reshape(p.m, p.n), bias=bias)
        if key is not None:  # gemm_prepacked is the one algorithm that runs it
            _calls.put(key, ACTIVATION_CODES[p.activation])
        return (y, y.copy()) if return_preactivation else y
    z = _empty(op, y.shape, y.dtype)
    pz = _gemm_problem(op, p.m, p.n, p.k, False, True, x2.dtype, p.bias, packed=True)
    _plan(op, pz, algo).run(x2, pw, out=z.reshape(p.m, p.n), bias=bias)
    _fc_kernels.activation_forward(z, y, ACTIVATION_CODES[p.activation])
    return y, z


def linear_backward(grad_output, input, weight, *, bias=True, activation=None, output=None,
                    preactivation=None, algo="auto", accumulate_into=None, stream=None):
    """Gradients of y = act(input @ weight.T + bias): returns (grad_input, grad_weight, grad_bias).

    bias: whether the forward had a bias (True or False; None as False); grad_bias is None without one. With an
    activation, pass the forward's output (enough for relu,
    tanh and sigmoid) or its preactivation (needed for gelu; see linear(return_preactivation=True)).
    accumulate_into: (grad_weight, grad_bias) arrays (grad_bias None without a bias; C-contiguous, of the
    weight's dtype) to which the gradients are added in place and which are returned, as autograd adds
    into ``.grad``: a layer applied at many steps sums its gradients without a pass of its own.
    """
    op = "linear_backward"
    if isinstance(weight, PackedWeight):
        weight = weight.weight
    if bias is None:
        bias = False
    elif hasattr(bias, "shape"):
        raise TypeError(f"{op}: bias is whether the forward had a bias (True or False), got an array")
    try:
        x = _array(op, "input", input)
        w = _array(op, "weight", weight, ndim=2)
        gy = _array(op, "grad_output", grad_output)
        for arr in (output, preactivation, *(accumulate_into if isinstance(accumulate_into, (list, tuple)) else ())):
            if device_of(arr) == "cuda":
                raise DeviceArray(op)
    except DeviceArray:
        return _gpu(op, grad_output=grad_output, input=input, weight=weight, output=output,
                    preactivation=preactivation, accumulate_into=accumulate_into).linear_backward(
            grad_output, input, weight, bias, activation, output, preactivation, algo, accumulate_into, stream)
    _host_stream(op, stream)
    out_f, in_f, expect = _linear_backward_shapes(op, x.shape, w.shape, gy.shape)
    dtype = _same_dtype(op, grad_output=gy, input=x, weight=w)
    act = _activation(op, activation)
    _flag(op, "bias", bias)
    saved = {}
    for name, arr in (("output", output), ("preactivation", preactivation)):
        if arr is not None:
            arr = _array(op, name, arr)
            if arr.dtype != dtype:
                raise TypeError(f"{op}: {name} must have dtype {dtype}, got {arr.dtype}")
            if arr.shape != expect:
                raise ValueError(f"{op}: {name} must have shape {expect}, got {arr.shape}")
            saved[name] = arr
    into_w, into_b = _linear_accumulate_targets(op, accumulate_into, w.shape, bias, dtype)
    if into_w is not None:
        _targets_apart(op, (("accumulate_into[0]", into_w), ("accumulate_into[1]", into_b)),
                       (("grad_output", gy), ("input", x), ("weight", w), *saved.items()))
    m = math.prod(x.shape[:-1])
    x2 = x.reshape(m, in_f)
    gy2 = gy.reshape(m, out_f)
    if act == "identity":
        gz = gy2
    else:
        if "preactivation" not in saved and ("output" not in saved or act == "gelu"):
            need = "preactivation" if act == "gelu" else "output or preactivation"
            raise ValueError(f"{op}: activation {act!r} needs the forward's {need}")
        z = saved.get("preactivation")
        y = saved.get("output")
        gz = _empty(op, (m, out_f), dtype)
        _fc_kernels.activation_backward(
            np.ascontiguousarray(gy2), None if z is None else np.ascontiguousarray(z),
            None if y is None else np.ascontiguousarray(y), gz, ACTIVATION_CODES[act],
        )
    # grad_input (M x K) = gz (M x N) @ weight (N x K)
    p_dx = _gemm_problem(op, m, in_f, out_f, False, False, dtype)
    grad_x = _empty(op, x.shape, dtype)
    _plan(op, p_dx, algo).run(gz, w, out=grad_x.reshape(m, in_f))
    # grad_weight (N x K) = gz.T (N x M) @ input (M x K)
    p_dw = _gemm_problem(op, out_f, in_f, m, True, False, dtype)
    grad_w = _empty(op, (out_f, in_f), dtype) if into_w is None else into_w
    _plan(op, p_dw, algo).run(gz.T, x2, out=grad_w, beta=0.0 if into_w is None else 1.0)
    grad_b = _fc_kernels.column_sums(np.ascontiguousarray(gz), into_b) if bias else None
    return grad_x, grad_w, grad_b


def _linear_accumulate_targets(op, into, w_shape, bias, dtype):
    """(grad_weight, grad_bias) targets of linear_backward's accumulate_into, checked; (None, None) without."""
    if into is None:
        return None, None
    if not isinstance(into, (list, tuple)) or len(into) != 2:
        raise TypeError(f"{op}: accumulate_into must be a pair (grad_weight, grad_bias), got "
                        f"{type(into).__name__}{'' if not isinstance(into, (list, tuple)) else f' of {len(into)}'}")
    out = []
    for name, a, shape in (("accumulate_into[0]", into[0], w_shape), ("accumulate_into[1]", into[1], w_shape[:1])):
        if name.endswith("[1]") and not bias:
            if a is not None:
                raise ValueError(f"{op}: {name} must be None when bias is False")
            out.append(None)
            continue
        out.append(_accumulate_target(op, name, a, shape, dtype))
    return out[0], out[1]
