"""The convolutions on the host: conv2d, conv2d_backward_data, conv2d_backward_filter and
conv2d_backward_bias (torch.nn.functional.conv2d's semantics and its gradients)."""
from __future__ import annotations

import numpy as np

from ..algos import conv_cpu as _conv_kernels
from .._checks import _DTYPE_NAMES, _array, _empty, _same_dtype
from ..backends import DeviceArray, cpu as _cpu, device_of, placement_error
from ..dispatch import dispatch_state
from ..problem import ConvProblem, _conv_pair, shown
from ._common import _calls, _plan, _problems


# ------------------------------------------------------------------------------------------ convolution
def _shape4(op: str, name: str, shape) -> tuple:
    try:
        t = tuple(int(v) for v in shape)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a sequence of 4 ints, got {shown(shape)}") from None
    if len(t) != 4 or any(v < 0 for v in t) or any(int(v) != v for v in shape):
        raise ValueError(
            f"{op}: {name} must be 4 non-negative ints (N, C, H, W or K, C/groups, R, S), got {shown(shape)}")
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


def _workspace(op: str, plan, dtype):
    """The workspace array a plan's run needs (None for none)."""
    try:
        return _cpu.workspace(plan.workspace_bytes, dtype.itemsize)
    except (MemoryError, ValueError):
        raise MemoryError(f"{op}: cannot allocate a workspace of {plan.workspace_bytes} bytes for "
                          f"{plan.algorithm.name}") from None


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
    if workspace.dtype.hasobject:
        raise TypeError(f"{op}: workspace must hold plain data (any numeric dtype), got dtype {workspace.dtype}")
    return workspace.reshape(-1).view(np.uint8)


def _apart(op: str, ws, **arrays) -> None:
    """A ValueError naming op and the argument where the caller's workspace shares memory with an input
    (the algorithm would overwrite it)."""
    if ws is not None:
        for name, a in arrays.items():
            if a is not None and np.may_share_memory(ws, a):
                raise ValueError(f"{op}: workspace overlaps {name}; the algorithm would overwrite it")


def _workspace_limit(ws):
    """The workspace a caller's ws (flat bytes, or None) holds for any algorithm, from its first aligned byte."""
    return None if ws is None else max(0, ws.nbytes - (_WORKSPACE_ALIGN - 1))


def _conv_plan(op: str, p, algo, ws):
    """The plan for p; with a caller's workspace ws, one whose workspace fits in it (its limit)."""
    return _plan(op, p, algo, _workspace_limit(ws))


def _conv_plan_workspace(op: str, p, algo, ws, dtype):
    """(plan, workspace) for a call. Where dnnkit provides the workspace (ws None) and algo is "auto", an
    algorithm whose workspace cannot be allocated gives way to the one dispatch chooses among those that
    need less, as far as one needing none; an algorithm the caller named fails with the MemoryError."""
    plan = _conv_plan(op, p, algo, ws)
    while True:
        try:
            return plan, _conv_workspace(op, plan, dtype, ws)
        except MemoryError:
            if ws is not None or algo != "auto" or plan.workspace_bytes == 0:
                raise
            try:
                plan = _plan(op, p, algo, plan.workspace_bytes - 1)
            except ValueError:  # none needs less (or DNNKIT_ALGO_<OP> names this one)
                raise MemoryError(f"{op}: cannot allocate a workspace of {plan.workspace_bytes} bytes for "
                                  f"{plan.algorithm.name}, and no algorithm needs less") from None


def _conv_workspace(op: str, plan, dtype, ws):
    """The workspace for the run: the library's (ws None), or the first aligned bytes of the caller's."""
    if ws is None:
        return _workspace(op, plan, dtype)
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


def _grown(shape, odd) -> tuple:
    """An N, C, H, W shape with _odd_same's extra bottom row and right column."""
    n, c, h, w = shape
    return n, c, h + odd[0][0], w + odd[0][1]


def _pad_bottom_right(x: np.ndarray, extra) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (0, extra[0]), (0, extra[1])))


def _conv2d_prepare(input, weight, bias, stride, padding, dilation, groups):
    op = "conv2d"
    x = _array(op, "input", input, ndim=(3, 4))
    if x.ndim == 3:
        x = x[None]  # unbatched: one image
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


def _conv2d_key(input, weight, bias, stride, padding, dilation, groups, algo):
    """A conv2d call's signature in _calls (an int or a string as itself, anything else as _typed gives it),
    or None where the call is not one to remember (a caller's workspace). A hit holds (plan, whether the
    output is small enough for NumPy's allocator)."""
    if not (type(input) is np.ndarray and type(weight) is np.ndarray and (bias is None or type(bias) is np.ndarray)
            and type(algo) is str):
        return None
    try:
        key = ("conv2d", input.shape, input.dtype, weight.shape, weight.dtype,
               None if bias is None else (bias.shape, bias.dtype),
               stride if type(stride) is int else _typed(stride),
               padding if type(padding) is int or type(padding) is str else _typed(padding),
               dilation if type(dilation) is int else _typed(dilation),
               groups if type(groups) is int else _typed(groups),
               algo, dispatch_state())
        hash(key)
    except TypeError:  # an unhashable argument: the checks report what is wrong with it
        return None
    return key


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algo="auto", workspace=None):
    """2-D convolution (cross-correlation), as torch.nn.functional.conv2d: input N x C x H x W (or C x H x W,
    unbatched), weight K x C/groups x R x S, bias K or None; stride, dilation int or pair; padding int, pair,
    "same" or "valid". Returns N x K x P x Q (K x P x Q for an unbatched input).

    workspace: an array the caller owns (any dtype, C-contiguous, sharing no memory with the inputs) for the
    algorithm's scratch, as cuDNN's
    workspace: "auto" then picks among the algorithms whose workspace fits in it, and an algorithm named
    by algo that needs more is an error saying how much (explain() lists each one's). None: dnnkit's own."""
    key = None if workspace is not None else _conv2d_key(input, weight, bias, stride, padding, dilation, groups, algo)
    hit = None if key is None else _calls.get(key)
    if hit is not None:
        plan, small = hit
        p = plan.problem
        y = np.empty((p.mb, p.oc, p.oh, p.ow), input.dtype) if small else \
            _empty("conv2d", (p.mb, p.oc, p.oh, p.ow), input.dtype)
        plan.run(np.ascontiguousarray(input), np.ascontiguousarray(weight), out=y,
                 bias=None if bias is None else np.ascontiguousarray(bias),
                 workspace=_workspace("conv2d", plan, input.dtype))
        return y
    if np.ndim(input) == 3 and device_of(input) != "cuda":
        x = _array("conv2d", "input", input, ndim=3)
        return conv2d(x[None], weight, bias, stride, padding, dilation, groups, algo=algo, workspace=workspace)[0]
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
    _apart("conv2d", ws, input=x, weight=w, bias=bias)
    plan, work = _conv_plan_workspace("conv2d", p, algo, ws, x.dtype)
    y = _empty("conv2d", (p.mb, p.oc, p.oh, p.ow), x.dtype)
    plan.run(np.ascontiguousarray(x), np.ascontiguousarray(w), out=y,
             bias=None if bias is None else np.ascontiguousarray(bias), workspace=work)
    if key is not None:
        _calls.put(key, (plan, y.nbytes < _cpu.recycle_bytes))
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
        dx = conv2d_backward_data(_grown((n, c, h, w_), odd), weight, grad_output, stride, odd[1], dilation,
                                  groups, algo=algo, workspace=workspace)
        return np.ascontiguousarray(dx[:, :, :h, :w_])  # the hand-padded row/column's gradient dropped
    op = "conv2d_backward_data"
    try:
        ws = _caller_workspace(op, workspace)
        p, w, dy = _conv2d_bwd_data_prepare(input_shape, weight, grad_output, stride, padding, dilation, groups)
    except DeviceArray:
        raise placement_error(op, weight=weight, grad_output=grad_output, workspace=workspace) from None
    _apart(op, ws, weight=w, grad_output=dy)
    plan, work = _conv_plan_workspace(op, p, algo, ws, w.dtype)
    dx = _empty(op, (p.mb, p.ic, p.ih, p.iw), w.dtype)
    plan.run(np.ascontiguousarray(w), np.ascontiguousarray(dy), out=dx, workspace=work)
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
    _apart(op, ws, input=x, grad_output=dy)
    plan, work = _conv_plan_workspace(op, p, algo, ws, x.dtype)
    dw = _empty(op, (p.oc, p.ic // p.g, p.kh, p.kw), x.dtype)
    plan.run(np.ascontiguousarray(x), np.ascontiguousarray(dy), out=dw, workspace=work)
    return dw


def conv2d_backward_bias(grad_output):
    """Gradient of conv2d with respect to its bias: grad_output (N, K, P, Q), or (K, P, Q) unbatched, summed
    over all but K."""
    op = "conv2d_backward_bias"
    try:
        dy = _array(op, "grad_output", grad_output, ndim=(3, 4))
        dy = np.ascontiguousarray(dy if dy.ndim == 4 else dy[None])
    except DeviceArray:
        raise placement_error(op, grad_output=grad_output) from None
    return _conv_kernels.bias_grad(dy, _empty(op, (dy.shape[1],), dy.dtype))
