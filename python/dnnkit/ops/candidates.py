"""explain(): the candidate algorithms for a call, a Problem or a descriptor, and why each can or cannot
run it."""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np

from ..algos import algorithms as _algorithms
from ..algos.base import Algorithm
from ..autotune.cost_model import ceilings_source
from ..backends import DeviceArray, cpu as _cpu, device_of, placement_error
from ..dispatch import explain_problem
from ..packed import PackedWeight
from ..problem import RNN_DIRECTIONS, RNN_MODES, ConvProblem, GemmProblem, RnnProblem, parse_descriptor, shown
from . import convolution as _conv, dense as _linear, recurrent as _recurrent
from .._checks import _array, _flag
from .._config import workspace_bytes
from ._common import _gpu
from ._rnn_args import _dropout, _lstm_hx, _rnn_mode


# ---------------------------------------------------------------------------------------------- explain
def _parse_descriptor(text: str, **kwargs):
    """A GEMM, RNN or benchdnn convolution descriptor (parse_descriptor); kwargs are its direction=, dtype=,
    bias=, device=. A direction that the descriptor's kind has not is an error, not ignored."""
    unknown = sorted(set(kwargs) - {"direction", "dtype", "bias", "device"})
    if unknown:
        raise TypeError(f"explain: a descriptor takes the keywords direction, dtype, bias and device, got {unknown}")
    if "dtype" in kwargs and not isinstance(kwargs["dtype"], str):
        try:
            kwargs["dtype"] = np.dtype(kwargs["dtype"]).name
        except TypeError:
            raise TypeError(f"explain: dtype must be 'float32' or 'float64', got {shown(kwargs['dtype'])}") from None
    stripped = text.strip()
    direction = kwargs.get("direction", "fwd")
    if stripped.startswith(RNN_MODES) and direction not in RNN_DIRECTIONS:
        raise ValueError(f"explain: {stripped!r} is an RNN descriptor, whose direction is 'fwd' or 'bwd'; got "
                         f"direction={direction!r}")
    if stripped.startswith("rnn_l"):
        raise ValueError(f"explain: {stripped!r}: an RNN descriptor names its cell: rnn_tanh_l... or rnn_relu_l...")
    try:
        if stripped.startswith(RNN_MODES):
            return parse_descriptor(text, **kwargs)
        try:
            GemmProblem.parse(text)
        except ValueError:
            try:
                ConvProblem.parse(text)
            except ValueError:  # neither: parse_descriptor says why of both
                return parse_descriptor(text, **kwargs)
            return ConvProblem.parse(text, **kwargs)  # a convolution: its keywords' errors alone
        p = parse_descriptor(text, **kwargs)
    except ValueError as e:
        raise ValueError(f"explain: {e}") from None
    if direction != "fwd":
        raise ValueError(f"explain: {stripped!r} is a GEMM descriptor, which has no direction; got "
                         f"direction={direction!r}")
    return p


class Explanation(list):
    """explain()'s answer: a list of Candidate, printed as a table after the problem and where its products
    run (`isa`: the kernels' instruction set, and whether a float32 product goes to AMX tiles)."""

    def __init__(self, problem, candidates, note=None):
        super().__init__(candidates)
        self.problem = problem
        self.isa = _isa_note(problem)
        self.note = note  # how the call relates to the problem shown, where it runs more than that one
        self.ceilings = ceilings_source(problem)  # what the predicted times scale by

    def __str__(self) -> str:
        lines = [f"{self.problem.op} {self.problem.descriptor()}", f"  on {self.isa}"]
        lines += [f"  {self.note}"] if self.note else []
        kind, _, why = self.ceilings.partition(": ")
        lines += ["  predicted times: " + {"measured": "this device's measured ceilings",
                                           "nominal": f"nominal ceilings, {why}"}.get(kind, why)]
        lines += [str(c) for c in self]
        return "\n".join(lines)


def _isa_note(p) -> str:
    """The kernels' instruction set for p, and whether its float32 products run on AMX tiles; for a GPU
    problem, the GPU (or why there is none)."""
    if getattr(p, "device", "cpu") == "cuda":
        from ..backends import cuda

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
            f"and a depth of 128 or more (192 under 512 columns), where every operand value splits")


def _either(op, prepare, args, **arrays):
    """The problem of a call: dense.py's _<op>_prepare(*args) on host arrays, gpu_dense.<op>_prepare on GPU
    arrays."""
    try:
        return getattr(_linear, f"_{prepare}")(*args)[0]
    except DeviceArray:
        return getattr(_gpu(op, **arrays), prepare)(*args)[0]


# Each entry: an operator's call signature (its keywords that do not shape the problem unread; algo is
# explain's own) giving the call's problem, or (problem, note, workspace limit): the note where the call
# runs more than that problem, the limit that the call's workspace= sets.
def _gemm(a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, stream=None):
    return _either("gemm", "gemm_prepare", (a, b, c, alpha, beta, trans_a, trans_b), a=a, b=b, c=c)


def _linear_call(input, weight, bias=None, *, activation=None, return_preactivation=False, stream=None):
    if isinstance(weight, PackedWeight):
        return _linear._linear_packed_prepare(input, weight, bias, activation)[0]
    return _either("linear", "linear_prepare", (input, weight, bias, activation), input=input, weight=weight,
                   bias=bias)


def _same_padded(op, x, weight_shape, stride, padding, dilation):
    """For padding='same' that pads one more on the bottom/right (conv2d's _odd_same): the input as the call
    runs it, a view of its shape (explain reads shapes only), and the symmetric padding; else (x, padding)."""
    odd = _conv._odd_same(weight_shape, stride, padding, dilation)
    if odd is None or np.ndim(x) != 4 or device_of(x) == "cuda":
        return x, padding
    x = _array(op, "input", x, ndim=4)
    return np.broadcast_to(np.zeros((), x.dtype), _conv._grown(x.shape, odd)), odd[1]


def _conv_call(op, p, workspace):
    limit = _conv._workspace_limit(_conv._caller_workspace(op, workspace))
    return p, None, limit


def _conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, workspace=None):
    if np.ndim(input) == 3 and device_of(input) != "cuda":  # unbatched: the call runs a batch of one
        input = _array("conv2d", "input", input, ndim=3)[None]
    input, padding = _same_padded("conv2d", input, np.shape(weight), stride, padding, dilation)
    return _conv_call("conv2d", _conv._conv2d_prepare(input, weight, bias, stride, padding, dilation, groups)[0],
                      workspace)


def _conv2d_bwd_data(input_shape, weight, grad_output, stride=1, padding=0, dilation=1, groups=1, *, workspace=None):
    op = "conv2d_backward_data"
    odd = _conv._odd_same(np.shape(weight), stride, padding, dilation)
    if odd is not None:
        input_shape, padding = _conv._grown(_conv._shape4(op, "input_shape", input_shape), odd), odd[1]
    return _conv_call(op, _conv._conv2d_bwd_data_prepare(input_shape, weight, grad_output, stride, padding, dilation,
                                                         groups)[0], workspace)


def _conv2d_bwd_filter(input, weight_shape, grad_output, stride=1, padding=0, dilation=1, groups=1, *,
                       workspace=None):
    op = "conv2d_backward_filter"
    try:
        shape = tuple(int(v) for v in weight_shape)
    except (TypeError, ValueError):
        shape = ()  # the usual checks report it
    input, padding = _same_padded(op, input, shape, stride, padding, dilation)
    return _conv_call(op, _conv._conv2d_bwd_filter_prepare(input, weight_shape, grad_output, stride, padding,
                                                           dilation, groups)[0], workspace)


def _rnn_problem(op, host, gpu, args, x):
    """(problem, on the host): recurrent.<host>(*args) on host arrays, gpu_recurrent.<gpu> on GPU arrays
    (a host input among them: the call's placement error)."""
    try:
        return getattr(_recurrent, host)(op, *args)[0], True
    except DeviceArray:
        if device_of(x) != "cuda":
            raise placement_error(op, input=x) from None
        from . import gpu_recurrent

        return getattr(gpu_recurrent, gpu)(op, *args)[0], False


def _sequence_problem(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size, train,
                      dropout, recompute):
    """A sequence call's problem; a host training forward with dropout between layers or recompute runs its
    layers as one-layer calls (recurrent._sequence_stack): then the first of them, and a note."""
    p, host = _rnn_problem(op, "_sequence_args", "sequence_args",
                           (mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size), x)
    p_drop, recompute, train = _dropout(op, dropout), _flag(op, "recompute", recompute), _flag(op, "train", train)
    if not (host and train and ((p_drop > 0.0 and p.layers > 1) or recompute)) or p.layers == 1:
        return p
    why = "dropout between layers" if p_drop > 0.0 else "recompute"
    return (dataclasses.replace(p, layers=1), f"the call runs its {p.layers} layers as one-layer problems ({why}): "
            f"the first is shown; the next take {p.dirs * (p.proj or p.hidden)} input features", None)


def _lstm(x, h0, c0, weights, *, num_layers=1, bidirectional=False, batch_first=False, train=False, dropout=0.0,
          generator=None, recompute=False, proj_size=0, stream=None):
    return _sequence_problem("lstm", "lstm", x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size,
                             train, dropout, recompute)


def _gru(x, h0, weights, *, num_layers=1, bidirectional=False, batch_first=False, train=False, dropout=0.0,
         generator=None, recompute=False, stream=None):
    return _sequence_problem("gru", "gru", x, h0, None, weights, num_layers, bidirectional, batch_first, 0, train,
                             dropout, recompute)


def _rnn(x, h0, weights, *, nonlinearity="tanh", num_layers=1, bidirectional=False, batch_first=False, train=False,
         dropout=0.0, generator=None, recompute=False, stream=None):
    return _sequence_problem("rnn", _rnn_mode(nonlinearity), x, h0, None, weights, num_layers,
                             bidirectional, batch_first, 0, train, dropout, recompute)


def _cell_problem(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    return _rnn_problem(op, "_cell_args", "cell_args", (mode, x, h, c, w_ih, w_hh, b_ih, b_hh), x)[0]


def _backward_problem(op, modes, reserve, cell, grads):
    """The backward problem of a training forward's reserve (host or GPU), checked as the backward checks it,
    its gradients too: grads, (grad_output, grad_h_n, grad_c_n) or a cell's (grad_h, grad_c)."""
    if type(reserve).__name__ == "GpuRnnReserve":
        if reserve.mode not in modes or reserve.cell != cell:
            raise ValueError(f"{op}: the reserve is from a {reserve.op} forward")
        from . import gpu_recurrent
        (gpu_recurrent.cell_grads if cell else gpu_recurrent.sequence_grads)(op, reserve, *grads)
        return dataclasses.replace(reserve.problem, direction="bwd")
    reserve = _recurrent._reserve(op, reserve, modes, cell)
    (_recurrent._cell_grads if cell else _recurrent._sequence_grads)(op, reserve, *grads)
    p = dataclasses.replace(reserve.problem, direction="bwd")
    if reserve.stack:
        return (dataclasses.replace(p, layers=1), f"the backward runs the forward's {len(reserve.stack)} one-layer "
                f"problems in reverse: the first layer's is shown", None)
    return p


_PREPARE = {
    "gemm": _gemm,
    "linear": _linear_call,
    "conv2d": _conv2d,
    "conv2d_backward_data": _conv2d_bwd_data,
    "conv2d_backward_filter": _conv2d_bwd_filter,
    "lstm": _lstm,
    "gru": _gru,
    "rnn": _rnn,
    "lstm_backward": lambda grad_output, grad_h_n, grad_c_n, reserve, *, accumulate_into=None: _backward_problem(
        "lstm_backward", ("lstm",), reserve, False, (grad_output, grad_h_n, grad_c_n)),
    "gru_backward": lambda grad_output, grad_h_n, reserve, *, accumulate_into=None: _backward_problem(
        "gru_backward", ("gru",), reserve, False, (grad_output, grad_h_n, None)),
    "rnn_backward": lambda grad_output, grad_h_n, reserve, *, accumulate_into=None: _backward_problem(
        "rnn_backward", ("rnn_tanh", "rnn_relu"), reserve, False, (grad_output, grad_h_n, None)),
    "lstm_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False: _cell_problem(
        "lstm_cell", "lstm", x, *_lstm_hx(hx), w_ih, w_hh, b_ih, b_hh),
    "gru_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False: _cell_problem(
        "gru_cell", "gru", x, hx, None, w_ih, w_hh, b_ih, b_hh),
    "rnn_tanh_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False: _cell_problem(
        "rnn_tanh_cell", "rnn_tanh", x, hx, None, w_ih, w_hh, b_ih, b_hh),
    "rnn_relu_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False: _cell_problem(
        "rnn_relu_cell", "rnn_relu", x, hx, None, w_ih, w_hh, b_ih, b_hh),
    "lstm_cell_backward": lambda grad_h, grad_c, reserve, *, accumulate_into=None: _backward_problem(
        "lstm_cell_backward", ("lstm",), reserve, True, (grad_h, grad_c)),
    "gru_cell_backward": lambda grad_h, reserve, *, accumulate_into=None: _backward_problem(
        "gru_cell_backward", ("gru",), reserve, True, (grad_h, None)),
    "rnn_cell_backward": lambda grad_h, reserve, *, accumulate_into=None: _backward_problem(
        "rnn_cell_backward", ("rnn_tanh", "rnn_relu"), reserve, True, (grad_h, None)),
}


def explain(what, *args, algo="auto", workspace_limit=None, **kwargs) -> Explanation:
    """The candidate algorithms for a call and why each can or cannot run it.

    what: an operator name with the call's arguments (explain("gemm", a, b, trans_b=True), explain("conv2d",
    x, w, padding=1, workspace=ws), explain("lstm", x, h0, c0, weights, num_layers=2),
    explain("lstm_backward", grad_output, None, None, reserve)), a Problem, or a problem descriptor string:
    GEMM ("m64n4096k4096tb_f32"), RNN ("lstm_l1t50mb16slc512sic512", direction="bwd" for its backward) or
    benchdnn convolution ("mb8ic64ih56oc64oh56kh3ph1", with direction=/dtype= as keywords).
    workspace_limit: as dnnkit.set_workspace_limit's, for this explanation (with a call's workspace=, the
    smaller of the two).
    """
    if not isinstance(algo, str) and not isinstance(algo, Algorithm):
        raise TypeError(f"explain: algo must be 'auto', an algorithm's name or an Algorithm, got {shown(algo)}")
    workspace_limit = workspace_bytes("explain", "workspace_limit", workspace_limit)
    note = None
    if isinstance(what, str) and what in _PREPARE:
        try:
            inspect.signature(_PREPARE[what]).bind(*args, **kwargs)
        except TypeError as e:  # the call's arguments do not fit the operator's signature
            raise TypeError(f"explain: {what}(): {e}") from None
        p = _PREPARE[what](*args, **kwargs)
        if isinstance(p, tuple):
            p, note, limit = p
            if limit is not None:
                workspace_limit = limit if workspace_limit is None else min(limit, workspace_limit)
    elif isinstance(what, str) and (not any(ch.isdigit() for ch in what) or what.strip().lower() in _PREPARE):
        # Every descriptor has a size in it; the operators' names are lower case.
        raise ValueError(f"explain: no operator {what.strip()!r} here; explain takes the calls of "
                         f"{', '.join(_PREPARE)} (with their arguments), a Problem, or a descriptor")
    elif isinstance(what, (str, GemmProblem, ConvProblem, RnnProblem)) and args:
        raise TypeError(f"explain: a Problem or a descriptor takes no call arguments; to explain a call, name its "
                        f"operator ({', '.join(_PREPARE)})")
    elif isinstance(what, (GemmProblem, ConvProblem, RnnProblem)):
        if kwargs:
            raise TypeError(f"explain: a Problem takes no keywords but algo and workspace_limit, got {sorted(kwargs)}")
        p = what
    elif isinstance(what, str):
        p = _parse_descriptor(what, **kwargs)
    else:
        raise TypeError(f"explain: what must be an operator name, a Problem or a descriptor, got {type(what).__name__}")
    if algo != "auto" and isinstance(algo, str):
        known = [a.name for a in _algorithms(p.op, p.device)]
        if algo not in known:
            raise ValueError(f"explain: algo must be 'auto' or one of {known} for {p.op}, got {algo!r}")
    return Explanation(p, explain_problem(p, algo, workspace_limit), note)
