"""The public array-op API: validate -> build a Problem -> dispatch -> run.

Semantics follow BLAS (gemm) and torch.nn.functional (linear). Errors name the operator and argument.
"""
from __future__ import annotations

import math

import numpy as np

from .algos import conv_cpu as _conv_kernels, gemm_cpu as _fc_kernels
from .algos.gemm_cpu import ACTIVATION_CODES, LINEAR_RUN_KINDS
from ._checks import (
    _DTYPE_NAMES, _activation, _array, _empty, _flag, _output, _same_dtype, _scalar, _unshared,
)
from .backends import DeviceArray, cpu as _cpu, device_of, placement_error
from ._config import get_workspace_limit
from .dispatch import dispatch_state, explain_problem, plan as _dispatch_plan
from .plans import Memo
from .packed import PackedWeight
from .problem import RNN_MODES, ConvProblem, GemmProblem, RnnProblem, _conv_pair, parse_descriptor


# Problems are immutable and built from a handful of ints, flags and names: keep one object per key so
# that a repeated call builds no dataclass and hashes to a cached dispatch decision.
_problems = Memo()


def _gemm_problem(m, n, k, trans_a, trans_b, dtype, bias=False, activation="identity") -> GemmProblem:
    key = (m, n, k, trans_a, trans_b, dtype, bias, activation)
    p = _problems.get(key)
    if p is None:
        p = _problems.put(key, GemmProblem(m, n, k, trans_a=trans_a, trans_b=trans_b, dtype=_DTYPE_NAMES[dtype],
                                           bias=bias, activation=activation))
    return p


def _plan(op: str, p, algo, workspace_limit=None):
    """dispatch.plan, its errors naming the public function op (linear's problems are GEMM problems)."""
    try:
        return _dispatch_plan(p, algo, workspace_limit)
    except (TypeError, ValueError) as e:
        msg = str(e)
        if op == p.op or not msg.startswith(f"{p.op}: "):
            raise
        raise type(e)(f"{op}: {msg[len(p.op) + 2:]}") from None


def _gpu(op: str, **arrays):
    """The GPU path of the public functions (gpu_ops), for a call whose arrays are on the GPU; raises
    placement_error when they are mixed with host arrays in a way its checks would not name."""
    from . import gpu_ops

    where = {device_of(v) for v in arrays.values() if not isinstance(v, (list, tuple, dict))} - {None}
    if "cuda" not in where:
        raise placement_error(op, **arrays)
    return gpu_ops


def _host_stream(op: str, stream) -> None:
    if stream is not None:
        raise TypeError(f"{op}: stream is for GPU arrays; the arrays given are on the host")


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
    p = _gemm_problem(m, n, k, bool(trans_a), bool(trans_b), dtype)
    return p, A, B, alpha, beta


def gemm(a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, algo="auto", stream=None):
    """C := alpha * op(a) @ op(b) + beta * C, with op(x) = x.T when trans_x, as BLAS sgemm/dgemm.

    a, b: 2-D float32 or float64 arrays of one dtype, any strides: NumPy arrays (run on the CPU) or GPU
    arrays (CuPy, PyTorch CUDA tensors, Numba device arrays; run on the GPU, on `stream` or the caller's
    current stream). When c is given it is updated in place and returned; when beta == 0 it is not read (it
    may hold NaN), and when alpha == 0 neither are a and b. Without c a new array is returned, of a's kind.
    """
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
    p = _gemm_problem(m, out_f, in_f, False, True, dtype, bias is not None, act)
    return p, x.reshape(m, in_f), w, bias, lead


# Calls already validated and dispatched, by signature: (input shape and dtype, weight's, bias's,
# activation, algo, dispatch state) -> (problem, algorithm). A repeated call (the batch-1 layer of an
# inference loop) then skips the checks and the dispatch, a few microseconds of a GEMV's tens.
# A hit whose algorithm names a kernel of linear_run (algos/gemm_cpu.py) goes straight to it: the output allocated, the
# kernel run, all in one C++ call.
_linear_calls = Memo(1024)


def _linear_key(input, weight, bias, activation, algo):
    if not (type(input) is np.ndarray and type(weight) is np.ndarray and (bias is None or type(bias) is np.ndarray)
            and (activation is None or type(activation) is str) and type(algo) is str):
        return None
    return (input.shape, input.dtype, weight.shape, weight.dtype, None if bias is None else (bias.shape, bias.dtype),
            activation, algo, get_workspace_limit(), dispatch_state())


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
    hit = None if key is None else _linear_calls.get(key)
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
            _linear_calls.put(key, (plan, LINEAR_RUN_KINDS.get(type(plan.algorithm))))
        return (y, y.copy()) if return_preactivation else y
    z = _empty("linear", y.shape, y.dtype)
    pz = _gemm_problem(p.m, p.n, p.k, False, True, w.dtype, p.bias)
    plan.algorithm.run(pz, x2, w.T, out=z.reshape(p.m, p.n), bias=bias)
    _fc_kernels.activation_forward(z, y, ACTIVATION_CODES[p.activation])
    return y, z


def _linear_packed(x, pw, bias, activation, return_preactivation, algo):
    """linear on a weight packed by pack_weight: its own kernel (gemm_prepacked), no dispatch."""
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
    _flag(op, "return_preactivation", return_preactivation)
    if algo != "auto":
        raise ValueError(f"linear: a packed weight runs its own kernel; algo must be 'auto', got {algo!r}")
    if not return_preactivation:
        return _fc_kernels.linear_prepacked(x, pw, bias, ACTIVATION_CODES[act])
    z = _fc_kernels.linear_prepacked(x, pw, bias, 0)
    if act == "identity":
        return z, z.copy()
    y = _empty(op, z.shape, z.dtype)
    _fc_kernels.activation_forward(z, y, ACTIVATION_CODES[act])
    return y, z


def linear_backward(grad_output, input, weight, *, bias=True, activation=None, output=None,
                    preactivation=None, algo="auto", accumulate_into=None, stream=None):
    """Gradients of y = act(input @ weight.T + bias): returns (grad_input, grad_weight, grad_bias).

    grad_bias is None when bias is False. With an activation, pass the forward's output (enough for relu,
    tanh and sigmoid) or its preactivation (needed for gelu; see linear(return_preactivation=True)).
    accumulate_into: (grad_weight, grad_bias) arrays (grad_bias None without a bias; C-contiguous, of the
    weight's dtype) to which the gradients are added in place and which are returned, as autograd adds
    into ``.grad``: a layer applied at many steps sums its gradients without a pass of its own.
    """
    op = "linear_backward"
    if isinstance(weight, PackedWeight):
        weight = weight.weight
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
    if x.ndim < 1:
        raise ValueError(f"{op}: input must have at least 1 dimension, got shape {x.shape}")
    dtype = _same_dtype(op, grad_output=gy, input=x, weight=w)
    out_f, in_f = w.shape
    if x.shape[-1] != in_f:
        raise ValueError(f"{op}: input has {x.shape[-1]} features but weight {w.shape} expects {in_f}")
    expect = x.shape[:-1] + (out_f,)
    if gy.shape != expect:
        raise ValueError(f"{op}: grad_output must have shape {expect}, got {gy.shape}")
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
    p_dx = _gemm_problem(m, in_f, out_f, False, False, dtype)
    grad_x = _empty(op, x.shape, dtype)
    _plan(op, p_dx, algo).run(gz, w, out=grad_x.reshape(m, in_f))
    # grad_weight (N x K) = gz.T (N x M) @ input (M x K)
    p_dw = _gemm_problem(out_f, in_f, m, True, False, dtype)
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


def _accumulate_target(op, name, a, shape, dtype) -> np.ndarray:
    """An array a backward adds a gradient of `shape` and `dtype` into (accumulate_into), checked."""
    shape = tuple(shape)
    if type(a) is not np.ndarray:
        raise TypeError(f"{op}: {name} must be a NumPy array of the gradient's shape {shape}, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {a.dtype} but the gradients are {dtype}")
    if a.shape != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {a.shape}")
    if not (a.flags.c_contiguous and a.flags.writeable):
        raise ValueError(f"{op}: {name} must be C-contiguous and writable (it is added to in place)")
    return a


# ------------------------------------------------------------------------------------------ convolution
def _shape4(op: str, name: str, shape) -> tuple:
    try:
        t = tuple(int(v) for v in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a sequence of 4 ints, got {shape!r}") from None
    if len(t) != 4 or any(v < 0 for v in t) or any(int(v) != v for v in shape):
        raise ValueError(f"{op}: {name} must be 4 non-negative ints (N, C, H, W or K, C/groups, R, S), got {shape!r}")
    return t


def _typed(v):
    """v as part of a cache key that tells 1 from True and 1 from 1.0 (lists become tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple((type(e), e) for e in v)
    return (type(v), v)


def _conv_problem(op, direction, x_shape, w_shape, stride, padding, dilation, groups, dtype, bias=False):
    """The ConvProblem of a call; one object per distinct call signature (building and validating one
    costs tens of microseconds, a dictionary hit well under one)."""
    try:
        key = (op, direction, x_shape, w_shape, _typed(stride), _typed(padding), _typed(dilation), _typed(groups),
               dtype, bias)
        p = _problems.get(key)
    except TypeError:  # an unhashable argument: no caching, from_arrays reports what is wrong with it
        key, p = None, None
    if p is None:
        p = ConvProblem.from_arrays(x_shape, w_shape, stride, padding, dilation, groups, direction=direction,
                                    dtype=_DTYPE_NAMES[dtype], bias=bias, op=op)
        if key is not None:
            _problems.put(key, p)
    return p


_SCRATCH_MIN_BYTES = 128 << 10  # csrc/common.h kRecycleBytes: the block cache's smallest block


def _workspace(plan, dtype):
    """The workspace array a plan's run needs (None for none)."""
    nbytes, p = plan.workspace_bytes, plan.problem
    if nbytes == 0:
        return None
    if nbytes < _SCRATCH_MIN_BYTES:
        return _empty(p.op, (nbytes // dtype.itemsize,), dtype)
    # Larger workspaces come from the kernels' block cache: a fresh mapping would take a page fault and a
    # zeroed page per 4 KiB on every call (a fifth of Winograd's backward filter on ResNet-50's res5, a
    # tenth of its 1x1 layers at batch 8).
    try:
        return _cpu.scratch(nbytes).view(dtype)
    except MemoryError:
        raise MemoryError(f"{p.op}: cannot allocate a workspace of {nbytes} bytes") from None


_WORKSPACE_ALIGN = 64  # bytes: a caller's workspace is used from its first 64-byte boundary


def _caller_workspace(op: str, workspace):
    """The caller's workspace= as flat bytes (None for none), or a TypeError/ValueError naming op."""
    if workspace is None:
        return None
    if device_of(workspace) == "cuda":
        raise DeviceArray(f"{op}: workspace is an array on a CUDA device")
    if not isinstance(workspace, np.ndarray):
        raise TypeError(f"{op}: workspace must be a NumPy array (any dtype), got {type(workspace).__name__}")
    if not workspace.flags.c_contiguous or not workspace.flags.writeable:
        raise ValueError(f"{op}: workspace must be a C-contiguous, writable array")
    return workspace.reshape(-1).view(np.uint8)


def _conv_plan(op: str, p, algo, ws):
    """The plan for p; with a caller's workspace ws, one whose workspace fits in it (its limit)."""
    return _plan(op, p, algo, None if ws is None else max(0, ws.nbytes - (_WORKSPACE_ALIGN - 1)))


def _conv_workspace(op: str, plan, dtype, ws):
    """The workspace for the run: the library's (ws None), or the first aligned bytes of the caller's."""
    if ws is None:
        return _workspace(plan, dtype)
    need, algorithm = plan.workspace_bytes, plan.algorithm
    if need == 0:
        return None
    off = -ws.ctypes.data % _WORKSPACE_ALIGN
    if ws.nbytes < off + need:
        raise ValueError(f"{op}: workspace holds {ws.nbytes} bytes; {algorithm.name} needs {need} from a "
                         f"{_WORKSPACE_ALIGN}-byte boundary ({need + _WORKSPACE_ALIGN - 1} bytes always suffice)")
    return ws[off:off + need - need % dtype.itemsize].view(dtype)


def _odd_same(weight_shape, stride, padding, dilation):
    """For padding='same' at stride 1 where dilation * (kernel - 1) is odd along a dimension (torch then pads
    one more on the bottom/right): ((rows, cols) to pad on the bottom/right by hand, the symmetric padding
    for the rest). None otherwise, and wherever the arguments are not valid (the usual checks report them)."""
    if not (isinstance(padding, str) and padding == "same") or len(weight_shape) != 4:
        return None
    try:
        (sh, sw), (dh, dw) = _conv_pair("conv2d", "stride", stride, 1), _conv_pair("conv2d", "dilation", dilation, 1)
    except (TypeError, ValueError):
        return None
    th, tw = dh * (weight_shape[2] - 1), dw * (weight_shape[3] - 1)
    if (sh, sw) != (1, 1) or min(th, tw) < 0 or (th % 2 == 0 and tw % 2 == 0):
        return None
    return (th % 2, tw % 2), (th // 2, tw // 2)


def _pad_bottom_right(x: np.ndarray, extra) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (0, extra[0]), (0, extra[1])))


def _conv2d_prepare(input, weight, bias, stride, padding, dilation, groups):
    op = "conv2d"
    x = _array(op, "input", input, ndim=4)
    w = _array(op, "weight", weight, ndim=4)
    if bias is not None:
        bias = _array(op, "bias", bias, ndim=1)
    dtype = x.dtype
    if w.dtype != dtype or (bias is not None and bias.dtype != dtype):
        _same_dtype(op, input=x, weight=w, bias=bias)  # raises, naming the arrays
    p = _conv_problem(op, "fwd", x.shape, w.shape, stride, padding, dilation, groups, dtype, bias is not None)
    if bias is not None and bias.shape[0] != p.oc:
        raise ValueError(f"conv2d: bias must have {p.oc} elements (output channels), got {bias.shape[0]}")
    return p, x, w, bias


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algo="auto", workspace=None):
    """2-D convolution (cross-correlation), as torch.nn.functional.conv2d: input N x C x H x W, weight
    K x C/groups x R x S, bias K or None; stride, dilation int or pair; padding int, pair, "same" or "valid".
    Returns N x K x P x Q.

    workspace: an array the caller owns (any dtype, C-contiguous) for the algorithm's scratch, as cuDNN's
    workspace: "auto" then picks among the algorithms whose workspace fits in it, and an algorithm named
    by algo that needs more is an error saying how much (explain() lists each one's). None: dnnkit's own."""
    odd = _odd_same(np.shape(weight), stride, padding, dilation)
    if odd is not None and np.ndim(input) == 4 and device_of(input) != "cuda":
        # The one extra row/column of padding on the bottom/right, by hand; the rest as usual.
        x = _array("conv2d", "input", input, ndim=4)
        return conv2d(_pad_bottom_right(x, odd[0]), weight, bias, stride, odd[1], dilation, groups, algo=algo,
                      workspace=workspace)
    try:
        ws = _caller_workspace("conv2d", workspace)
        p, x, w, bias = _conv2d_prepare(input, weight, bias, stride, padding, dilation, groups)
    except DeviceArray:
        raise placement_error("conv2d", input=input, weight=weight, bias=bias, workspace=workspace) from None
    plan = _conv_plan("conv2d", p, algo, ws)
    y = _empty("conv2d", (p.mb, p.oc, p.oh, p.ow), x.dtype)
    plan.run(np.ascontiguousarray(x), np.ascontiguousarray(w), out=y,
             bias=None if bias is None else np.ascontiguousarray(bias),
             workspace=_conv_workspace("conv2d", plan, x.dtype, ws))
    return y


def _conv2d_bwd_data_prepare(input_shape, weight, grad_output, stride, padding, dilation, groups):
    op = "conv2d_backward_data"
    shape = _shape4(op, "input_shape", input_shape)
    w = _array(op, "weight", weight, ndim=4)
    dy = _array(op, "grad_output", grad_output, ndim=4)
    dtype = _same_dtype(op, weight=w, grad_output=dy)
    p = _conv_problem(op, "bwd_data", shape, w.shape, stride, padding, dilation, groups, dtype)
    if dy.shape != (p.mb, p.oc, p.oh, p.ow):
        raise ValueError(f"{op}: grad_output must have shape {(p.mb, p.oc, p.oh, p.ow)}, got {dy.shape}")
    return p, w, dy


def conv2d_backward_data(input_shape, weight, grad_output, stride=1, padding=0, dilation=1, groups=1, *,
                         algo="auto", workspace=None):
    """Gradient of conv2d with respect to its input, as torch.nn.grad.conv2d_input (workspace: as conv2d's)."""
    odd = _odd_same(np.shape(weight), stride, padding, dilation)
    if odd is not None:
        n, c, h, w_ = _shape4("conv2d_backward_data", "input_shape", input_shape)
        dx = conv2d_backward_data((n, c, h + odd[0][0], w_ + odd[0][1]), weight, grad_output, stride, odd[1], dilation,
                                  groups, algo=algo, workspace=workspace)
        return np.ascontiguousarray(dx[:, :, :h, :w_])  # the hand-padded row/column's gradient dropped
    op = "conv2d_backward_data"
    try:
        ws = _caller_workspace(op, workspace)
        p, w, dy = _conv2d_bwd_data_prepare(input_shape, weight, grad_output, stride, padding, dilation, groups)
    except DeviceArray:
        raise placement_error(op, weight=weight, grad_output=grad_output, workspace=workspace) from None
    plan = _conv_plan(op, p, algo, ws)
    dx = _empty(op, (p.mb, p.ic, p.ih, p.iw), w.dtype)
    plan.run(np.ascontiguousarray(w), np.ascontiguousarray(dy), out=dx,
             workspace=_conv_workspace(op, plan, w.dtype, ws))
    return dx


def _conv2d_bwd_filter_prepare(input, weight_shape, grad_output, stride, padding, dilation, groups):
    op = "conv2d_backward_filter"
    x = _array(op, "input", input, ndim=4)
    shape = _shape4(op, "weight_shape", weight_shape)
    dy = _array(op, "grad_output", grad_output, ndim=4)
    dtype = _same_dtype(op, input=x, grad_output=dy)
    p = _conv_problem(op, "bwd_filter", x.shape, shape, stride, padding, dilation, groups, dtype)
    if dy.shape != (p.mb, p.oc, p.oh, p.ow):
        raise ValueError(f"{op}: grad_output must have shape {(p.mb, p.oc, p.oh, p.ow)}, got {dy.shape}")
    return p, x, dy


def conv2d_backward_filter(input, weight_shape, grad_output, stride=1, padding=0, dilation=1, groups=1, *,
                           algo="auto", workspace=None):
    """Gradient of conv2d with respect to its weight, as torch.nn.grad.conv2d_weight (workspace: as conv2d's)."""
    try:
        shape = tuple(int(v) for v in weight_shape)
    except (TypeError, ValueError):
        shape = ()  # the usual checks report it
    odd = _odd_same(shape, stride, padding, dilation)
    if odd is not None and np.ndim(input) == 4 and device_of(input) != "cuda":
        x = _array("conv2d_backward_filter", "input", input, ndim=4)
        return conv2d_backward_filter(_pad_bottom_right(x, odd[0]), weight_shape, grad_output, stride, odd[1],
                                      dilation, groups, algo=algo, workspace=workspace)
    op = "conv2d_backward_filter"
    try:
        ws = _caller_workspace(op, workspace)
        p, x, dy = _conv2d_bwd_filter_prepare(input, weight_shape, grad_output, stride, padding, dilation, groups)
    except DeviceArray:
        raise placement_error(op, input=input, grad_output=grad_output, workspace=workspace) from None
    plan = _conv_plan(op, p, algo, ws)
    dw = _empty(op, (p.oc, p.ic // p.g, p.kh, p.kw), x.dtype)
    plan.run(np.ascontiguousarray(x), np.ascontiguousarray(dy), out=dw,
             workspace=_conv_workspace(op, plan, x.dtype, ws))
    return dw


def conv2d_backward_bias(grad_output):
    """Gradient of conv2d with respect to its bias: grad_output summed over N, H and W."""
    op = "conv2d_backward_bias"
    try:
        dy = np.ascontiguousarray(_array(op, "grad_output", grad_output, ndim=4))
    except DeviceArray:
        raise placement_error(op, grad_output=grad_output) from None
    return _conv_kernels.bias_grad(dy, _empty(op, (dy.shape[1],), dy.dtype))


# ---------------------------------------------------------------------------------------------- explain
def _parse_descriptor(text: str, **kwargs):
    """A GEMM descriptor (m..n..k.., a strict grammar, tried first) or a benchdnn convolution descriptor;
    kwargs are ConvProblem.parse's (direction=, dtype=, ...), and force the convolution grammar."""
    if kwargs and not text.strip().startswith(RNN_MODES):
        return ConvProblem.parse(text, **kwargs)
    try:
        return parse_descriptor(text, **kwargs)
    except ValueError as e:
        raise ValueError(f"explain: {e}") from None


class Explanation(list):
    """explain()'s answer: a list of Candidate, printed as a table after the problem and where its products
    run (`isa`: the kernels' instruction set, and whether a float32 product goes to AMX tiles)."""

    def __init__(self, problem, candidates):
        super().__init__(candidates)
        self.problem = problem
        self.isa = _isa_note(problem)

    def __str__(self) -> str:
        lines = [f"{self.problem.op} {self.problem.descriptor()}", f"  on {self.isa}"]
        lines += [str(c) for c in self]
        return "\n".join(lines)


def _isa_note(p) -> str:
    """The kernels' instruction set for p, and whether its float32 products run on AMX tiles; for a GPU
    problem, the GPU (or why there is none)."""
    if getattr(p, "device", "cpu") == "cuda":
        from .backends import cuda

        s = cuda.status()
        if cuda.simulator():
            return "the CUDA simulator (Numba-CUDA kernels run on the CPU)"
        if not s["available"]:
            return f"no usable GPU here: {s['reason']}"
        d = s["devices"][0]
        return f"{d['name']} (compute capability {d['compute_capability']}, {d['sm_count']} SMs), Numba-CUDA kernels"
    isa = _cpu.active_isa()
    if not _cpu.amx_enabled() or isa != "avx512" or getattr(p, "dtype", "float32") != "float32":
        return f"{isa} FMA kernels"
    if isinstance(p, GemmProblem):
        if _cpu.amx_takes_shape(p.m, p.n, p.k):
            return (f"AMX tiles: the blocked GEMM runs this {p.m} x {p.n} x {p.k} product on them (float32 split into "
                    f"bfloat16 parts) where every operand value splits, else on the {isa} FMA kernels")
        return f"{isa} FMA kernels (this product's shape is too small for the AMX tiles)"
    return (f"{isa} FMA kernels, and AMX tiles for the float32 products inside of 192 or more rows and columns "
            f"and a depth of 64 or more, where every operand value splits")


def _either(op, prepare, args, **arrays):
    """The problem of a call: api's _<op>_prepare(*args) on host arrays, gpu_ops.<op>_prepare on GPU arrays."""
    try:
        return globals()[f"_{prepare}"](*args)[0]
    except DeviceArray:
        return getattr(_gpu(op, **arrays), prepare)(*args)[0]


_PREPARE = {
    "gemm": lambda a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False: _either(
        "gemm", "gemm_prepare", (a, b, c, alpha, beta, trans_a, trans_b), a=a, b=b, c=c),
    "linear": lambda input, weight, bias=None, *, activation=None: _either(
        "linear", "linear_prepare", (input, weight, bias, activation), input=input, weight=weight, bias=bias),
    "conv2d": lambda input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1: _conv2d_prepare(
        input, weight, bias, stride, padding, dilation, groups)[0],
    "conv2d_backward_data": lambda input_shape, weight, grad_output, stride=1, padding=0, dilation=1, groups=1: (
        _conv2d_bwd_data_prepare(input_shape, weight, grad_output, stride, padding, dilation, groups)[0]),
    "conv2d_backward_filter": lambda input, weight_shape, grad_output, stride=1, padding=0, dilation=1, groups=1: (
        _conv2d_bwd_filter_prepare(input, weight_shape, grad_output, stride, padding, dilation, groups)[0]),
}


def explain(what, *args, algo="auto", workspace_limit=None, **kwargs) -> Explanation:
    """The candidate algorithms for a call and why each can or cannot run it.

    what: an operator name with the call's arguments (explain("gemm", a, b, trans_b=True)), a Problem,
    or a problem descriptor string: GEMM ("m64n4096k4096tb_f32"), RNN ("lstm_l1t50mb16slc512sic512") or
    benchdnn convolution ("mb8ic64ih56oc64oh56kh3ph1", with direction=/dtype= as keywords).
    """
    if isinstance(what, (GemmProblem, ConvProblem, RnnProblem)):
        p = what
    elif isinstance(what, str) and what in _PREPARE:
        if any(isinstance(v, PackedWeight) for v in (*args, *kwargs.values())):
            raise ValueError(f"explain: a packed weight (dnnkit.pack_weight) runs its own kernel, gemm_prepacked, "
                             f"not a registry algorithm; explain {what} with the array it was packed from")
        p = _PREPARE[what](*args, **kwargs)
    elif isinstance(what, str):
        p = _parse_descriptor(what, **kwargs)
    else:
        raise TypeError(f"explain: what must be an operator name, a Problem or a descriptor, got {type(what).__name__}")
    return Explanation(p, explain_problem(p, algo, workspace_limit))
