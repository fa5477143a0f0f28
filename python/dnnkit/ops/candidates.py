"""explain(): the candidate algorithms for a call, a Problem or a descriptor, and why each can or cannot
run it."""
from __future__ import annotations

import dataclasses
import inspect
import numbers

from ..algos import algorithms as _algorithms
from ..algos.base import Algorithm
from ..backends import DeviceArray, cpu as _cpu, device_of, placement_error
from ..dispatch import explain_problem
from ..packed import PackedWeight
from ..problem import RNN_MODES, ConvProblem, GemmProblem, RnnProblem, parse_descriptor, shown
from . import convolution as _conv, dense as _linear, recurrent as _recurrent
from ._common import _gpu


# ---------------------------------------------------------------------------------------------- explain
def _parse_descriptor(text: str, **kwargs):
    """A GEMM descriptor (m..n..k.., a strict grammar, tried first) or a benchdnn convolution descriptor;
    kwargs are ConvProblem.parse's (direction=, dtype=, ...), and force the convolution grammar."""
    if kwargs and not text.strip().startswith(RNN_MODES):
        try:
            return ConvProblem.parse(text, **kwargs)
        except ValueError:
            try:
                parse_descriptor(text)
            except ValueError:
                raise
            raise ValueError(f"explain: {text!r} is a GEMM descriptor, which writes its layout and dtype in it "
                             f"(m64n64k64tb_f64); the keywords {sorted(kwargs)} are for convolution "
                             f"descriptors") from None
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
            f"and a depth of 64 or more, where every operand value splits")


def _either(op, prepare, args, **arrays):
    """The problem of a call: dense.py's _<op>_prepare(*args) on host arrays, gpu_dense.<op>_prepare on GPU
    arrays."""
    try:
        return getattr(_linear, f"_{prepare}")(*args)[0]
    except DeviceArray:
        return getattr(_gpu(op, **arrays), prepare)(*args)[0]


def _rnn_problem(op, host, gpu, args, x):
    """The problem of an RNN call: recurrent.<host>(*args) on host arrays, gpu_recurrent.<gpu> on GPU
    arrays (a host input among them: the call's placement error)."""
    try:
        return getattr(_recurrent, host)(op, *args)[0]
    except DeviceArray:
        if device_of(x) != "cuda":
            raise placement_error(op, input=x) from None
        from . import gpu_recurrent

        return getattr(gpu_recurrent, gpu)(op, *args)[0]


def _sequence_problem(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size):
    return _rnn_problem(op, "_sequence_args", "sequence_args",
                        (mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size), x)


# lstm/gru/rnn's signatures; the keywords that do not shape the problem (train, dropout, ...) are unread.
def _lstm(x, h0, c0, weights, *, num_layers=1, bidirectional=False, batch_first=False, train=False, dropout=0.0,
          generator=None, recompute=False, proj_size=0, stream=None):
    return _sequence_problem("lstm", "lstm", x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size)


def _gru(x, h0, weights, *, num_layers=1, bidirectional=False, batch_first=False, train=False, dropout=0.0,
         generator=None, recompute=False, stream=None):
    return _sequence_problem("gru", "gru", x, h0, None, weights, num_layers, bidirectional, batch_first, 0)


def _rnn(x, h0, weights, *, nonlinearity="tanh", num_layers=1, bidirectional=False, batch_first=False, train=False,
         dropout=0.0, generator=None, recompute=False, stream=None):
    return _sequence_problem("rnn", _recurrent._rnn_mode(nonlinearity), x, h0, None, weights, num_layers,
                             bidirectional, batch_first, 0)


def _cell_problem(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    return _rnn_problem(op, "_cell_args", "cell_args", (mode, x, h, c, w_ih, w_hh, b_ih, b_hh), x)


def _backward_problem(op, modes, reserve, cell):
    """The backward problem of a training forward's reserve (host or GPU), checked as the backward checks it."""
    if type(reserve).__name__ == "GpuRnnReserve":
        if reserve.mode not in modes or reserve.cell != cell:
            raise ValueError(f"{op}: the reserve is from a {reserve.op} forward")
    else:
        reserve = _recurrent._reserve(op, reserve, modes, cell)
    return dataclasses.replace(reserve.problem, direction="bwd")


_PREPARE = {
    "gemm": lambda a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False: _either(
        "gemm", "gemm_prepare", (a, b, c, alpha, beta, trans_a, trans_b), a=a, b=b, c=c),
    "linear": lambda input, weight, bias=None, *, activation=None: (
        _linear._linear_packed_prepare(input, weight, bias, activation)[0] if isinstance(weight, PackedWeight)
        else _either("linear", "linear_prepare", (input, weight, bias, activation), input=input, weight=weight,
                     bias=bias)),
    "conv2d": lambda input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1: _conv._conv2d_prepare(
        input, weight, bias, stride, padding, dilation, groups)[0],
    "conv2d_backward_data": lambda input_shape, weight, grad_output, stride=1, padding=0, dilation=1, groups=1: (
        _conv._conv2d_bwd_data_prepare(input_shape, weight, grad_output, stride, padding, dilation, groups)[0]),
    "conv2d_backward_filter": lambda input, weight_shape, grad_output, stride=1, padding=0, dilation=1, groups=1: (
        _conv._conv2d_bwd_filter_prepare(input, weight_shape, grad_output, stride, padding, dilation, groups)[0]),
    "lstm": _lstm,
    "gru": _gru,
    "rnn": _rnn,
    "lstm_backward": lambda grad_output, grad_h_n, grad_c_n, reserve, *, accumulate_into=None: _backward_problem(
        "lstm_backward", ("lstm",), reserve, False),
    "gru_backward": lambda grad_output, grad_h_n, reserve, *, accumulate_into=None: _backward_problem(
        "gru_backward", ("gru",), reserve, False),
    "rnn_backward": lambda grad_output, grad_h_n, reserve, *, accumulate_into=None: _backward_problem(
        "rnn_backward", ("rnn_tanh", "rnn_relu"), reserve, False),
    "lstm_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto": _cell_problem(
        "lstm_cell", "lstm", x, *_recurrent._lstm_hx(hx), w_ih, w_hh, b_ih, b_hh),
    "gru_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto": _cell_problem(
        "gru_cell", "gru", x, hx, None, w_ih, w_hh, b_ih, b_hh),
    "rnn_tanh_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto": _cell_problem(
        "rnn_tanh_cell", "rnn_tanh", x, hx, None, w_ih, w_hh, b_ih, b_hh),
    "rnn_relu_cell": lambda x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto": _cell_problem(
        "rnn_relu_cell", "rnn_relu", x, hx, None, w_ih, w_hh, b_ih, b_hh),
    "lstm_cell_backward": lambda grad_h, grad_c, reserve, *, accumulate_into=None: _backward_problem(
        "lstm_cell_backward", ("lstm",), reserve, True),
    "gru_cell_backward": lambda grad_h, reserve, *, accumulate_into=None: _backward_problem(
        "gru_cell_backward", ("gru",), reserve, True),
    "rnn_cell_backward": lambda grad_h, reserve, *, accumulate_into=None: _backward_problem(
        "rnn_cell_backward", ("rnn_tanh", "rnn_relu"), reserve, True),
}


def explain(what, *args, algo="auto", workspace_limit=None, **kwargs) -> Explanation:
    """The candidate algorithms for a call and why each can or cannot run it.

    what: an operator name with the call's arguments (explain("gemm", a, b, trans_b=True), explain("lstm",
    x, h0, c0, weights, num_layers=2), explain("lstm_backward", grad_output, None, None, reserve)), a
    Problem, or a problem descriptor string: GEMM ("m64n4096k4096tb_f32"), RNN ("lstm_l1t50mb16slc512sic512") or
    benchdnn convolution ("mb8ic64ih56oc64oh56kh3ph1", with direction=/dtype= as keywords).
    """
    if not isinstance(algo, str) and not isinstance(algo, Algorithm):
        raise TypeError(f"explain: algo must be 'auto', an algorithm's name or an Algorithm, got {shown(algo)}")
    if workspace_limit is not None and (isinstance(workspace_limit, bool) or
                                        not isinstance(workspace_limit, numbers.Integral) or workspace_limit < 0):
        raise (ValueError if isinstance(workspace_limit, numbers.Integral) and not isinstance(workspace_limit, bool)
               else TypeError)(f"explain: workspace_limit must be None or a number of bytes >= 0, got "
                               f"{shown(workspace_limit)}")
    if isinstance(what, (GemmProblem, ConvProblem, RnnProblem)):
        p = what
    elif isinstance(what, str) and what in _PREPARE:
        try:
            inspect.signature(_PREPARE[what]).bind(*args, **kwargs)
        except TypeError as e:  # the call's arguments do not fit the operator's signature
            raise TypeError(f"explain: {what}(): {e}") from None
        p = _PREPARE[what](*args, **kwargs)
    elif isinstance(what, str):
        p = _parse_descriptor(what, **kwargs)
    else:
        raise TypeError(f"explain: what must be an operator name, a Problem or a descriptor, got {type(what).__name__}")
    if algo != "auto" and isinstance(algo, str):
        known = [a.name for a in _algorithms(p.op, p.device)]
        if algo not in known:
            raise ValueError(f"explain: algo must be 'auto' or one of {known} for {p.op}, got {algo!r}")
    return Explanation(p, explain_problem(p, algo, workspace_limit))
