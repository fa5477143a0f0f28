"""Fused RNNs on the CPU: LSTM, GRU and Elman RNN (tanh or ReLU) cells and sequences, forward and backward
through time, with the semantics and weight shapes of torch.nn.LSTM / GRU / RNN and their cells.

Forward:
    lstm(x, h0, c0, weights, *, num_layers=1, bidirectional=False, batch_first=False, train=False,
         proj_size=0) -> (output, (h_n, c_n))         [+ reserve when train=True]
    gru(x, h0, weights, ...) / rnn(x, h0, weights, *, nonlinearity="tanh", ...) -> (output, h_n) [+ reserve]
    lstm_cell(x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto") -> (h', c')  [+ reserve]
    gru_cell(x, h, ...), rnn_tanh_cell(x, h, ...), rnn_relu_cell(x, h, ...) -> h'    [+ reserve]

Backward (from the reserve a forward with train=True returned):
    lstm_backward(grad_output, grad_h_n, grad_c_n, reserve) -> (grad_x, grad_h0, grad_c0, grad_weights)
    gru_backward(grad_output, grad_h_n, reserve) / rnn_backward(...) -> (grad_x, grad_h0, grad_weights)
    lstm_cell_backward(grad_h, grad_c, reserve) -> (grad_x, grad_h, grad_c, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh)
    gru_cell_backward(grad_h, reserve) / rnn_cell_backward(grad_h, reserve)
        -> (grad_x, grad_h, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh)

Any grad_* argument may be None (no gradient flows in from there). grad_weights follows the forward's
`weights`: a list in the same order, or a dict with the same keys. Gradients of h0/c0 are returned even
when they were None (the gradient with respect to the zero initial state); bias gradients are None
when the forward had no biases.

The reserve (an RnnReserve, cuDNN's "reserve space") holds what backward reads: references to the
forward's input, initial states, weights and layer outputs (the returned output among them), and one
buffer of saved gate activations whose size is known from the problem (RnnReserve.reserve_bytes:
T*B*H*(5 LSTM | 6 LSTM with a projection | 4 GRU | 0 RNN) elements per layer and direction). Arrays
the forward was given or returned must not be modified in place before the backward, as with cuDNN's
y argument.

Weights: `weights` is a list in the order of the torch module's parameters (weight_ih_l0, weight_hh_l0,
bias_ih_l0, bias_hh_l0, then the `_reverse` set, then the next layer; 2 entries per layer and direction
without biases) or a dict keyed by those names. Shapes: weight_ih_l{k} (G*H, I_k), weight_hh_l{k}
(G*H, H), biases (G*H,), with G = 4 (LSTM, gates i, f, g, o), 3 (GRU, r, z, n) or 1, I_0 = input size
and I_k = D*H above.

LSTM projections (lstm(..., proj_size=P), torch.nn.LSTM's proj_size, 0 < P < H): h_t = W_hr (o * tanh(c_t))
is P wide, so the output is (T, B, D*P), h0 and h_n are (L*D, B, P) while c0 and c_n stay (L*D, B, H);
weight_hh_l{k} is (4H, P), I_k = D*P above the first layer, and each layer-direction has one more
weight, weight_hr_l{k} (P, H), after its biases (torch's parameter order). The projection is a second
product in each step of the C++ time loop.

Dropout (lstm/gru/rnn with dropout=p and train=True): the output of every layer but the last is
multiplied by a keep mask scaled by 1/(1-p) before the next layer reads it, as torch.nn.LSTM(dropout=p)
in training mode; the layers then run as one-layer calls of the fused kernel, and the reserve keeps the
masks (RnnReserve.dropout_masks) for the backward.
"""
from __future__ import annotations

import numpy as np

from ..algos.rnn_cpu import reserve_elems as _reserve_elems
from ..backends import DeviceArray, device_of, placement_error
from .._checks import _DTYPE_NAMES, _FLOAT_DTYPES, _array, _empty, _flag, _new_problem
from ..dispatch import dispatch_state
from ..packed import PackedWeight, unpacked
from ..problem import RNN_GATES, RnnProblem
from ._common import _accumulate_target, _calls, _plan, _problems, _targets_apart
from ._rnn_args import (_dropout, _flat, _generator, _layers, _lstm_hx, _proj_size, _rnn_mode, _shape_error,
                        _weight_label, _weights)

_CELL_CODES = {"lstm": 0, "gru": 1, "rnn_tanh": 2, "rnn_relu": 3}


class RnnReserve:
    """What a training forward saved for its backward (opaque; see the module docstring).

    mode: 'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'; cell: whether a cell (not a sequence) made it.
    reserve_bytes: the saved-activation buffer; nbytes: that plus the layer outputs kept for backward.
    """

    __slots__ = ("op", "mode", "cell", "shape", "problem", "x", "h0", "c0", "weights", "names", "as_dict", "has_bias", "ys",
                 "buffer", "batch_first", "unbatched", "stack", "masks")

    def __init__(self, **kw):
        self.stack = self.masks = None  # a stack of one-layer reserves, and the dropout masks between them
        for k, v in kw.items():
            setattr(self, k, v)

    @property
    def dropout_masks(self) -> list:
        """The scaled keep masks (0 or 1/(1-p), shape (T, B, D*S) with S = H, or P with a projection)
        applied to the output of each layer but the last in a training forward with dropout; empty
        without dropout."""
        return list(self.masks or [])

    @property
    def reserve_bytes(self) -> int:
        if self.stack:
            return int(sum(r.reserve_bytes for r in self.stack) + sum(m.nbytes for m in self.masks))
        return 0 if self.buffer is None else int(self.buffer.nbytes)

    @property
    def nbytes(self) -> int:
        if self.stack:
            masked = sum(r.x.nbytes for r in self.stack[1:]) if self.masks else 0  # the masked layer inputs
            return int(sum(r.nbytes for r in self.stack) + sum(m.nbytes for m in self.masks) + masked)
        return int(self.reserve_bytes + sum(y.nbytes for y in self.ys))

    def __repr__(self) -> str:
        _, T, B, I, H, L, D, P = self.shape
        return (f"<RnnReserve {self.op}: T={T} B={B} I={I} H={H}{f' P={P}' if P else ''} layers={L} "
                f"directions={D} {self.x.dtype} {self.nbytes} bytes>")


def _problem(op, mode, T, B, I, H, L, D, bias, direction, dtype, P=0) -> RnnProblem:
    """One RnnProblem per distinct call signature (a dictionary hit, not a validation, per call)."""
    key = ("rnn", mode, T, B, I, H, L, D, bias, direction, dtype, P)
    p = _problems.get(key)
    if p is None:
        p = _problems.put(key, _new_problem(op, RnnProblem, mode, T, B, I, H, layers=L, dirs=D, bias=bias,
                                            direction=direction, dtype=_DTYPE_NAMES[np.dtype(dtype)], proj=P))
    return p


# ------------------------------------------------------------------------------------------------ checks
def _check_weights(op, mode, arrays, names, as_dict, has_bias, dtype, input_size, num_layers, dirs, proj=0):
    """Contiguous arrays of the right shapes and dtype, as the kernel's flat list (4 per layer-direction,
    None for absent biases, and w_hr fifth with a projection); returns (flat, hidden_size)."""
    G = RNN_GATES[mode]
    per = (4 if has_bias else 2) + (1 if proj else 0)
    checked = []
    for i, w in enumerate(arrays):
        label = _weight_label(names, as_dict, i)
        if isinstance(w, PackedWeight):
            raise TypeError(f"{op}: {label} is a packed weight; the sequences pack their weights themselves, once "
                            f"per call (packed weights are for the cells and linear)")
        a = _array(op, label, w)
        if a.dtype != dtype:
            raise TypeError(f"{op}: {label} has dtype {a.dtype} but input has {dtype}; all arrays must share one dtype")
        checked.append(a)
    w_hh0 = checked[1]
    if proj:
        # H from weight_hr_l0 (P, H); torch.nn.LSTM requires 0 < proj_size < hidden_size.
        w_hr0 = checked[per - 1]
        if w_hr0.ndim != 2 or w_hr0.shape[0] != proj or w_hr0.shape[1] <= proj:
            raise ValueError(f"{op}: {_weight_label(names, as_dict, per - 1)} must be 2-D of shape (proj_size, "
                             f"hidden_size) = ({proj}, hidden_size) with hidden_size > proj_size, "
                             f"got shape {w_hr0.shape}")
        H, S = w_hr0.shape[1], proj
    else:
        if w_hh0.ndim != 2 or w_hh0.shape[0] != G * w_hh0.shape[1] or w_hh0.shape[1] < 1:
            raise ValueError(f"{op}: {_weight_label(names, as_dict, 1)} must be 2-D of shape ({G}*hidden_size, "
                             f"hidden_size) with hidden_size >= 1, got shape {w_hh0.shape}")
        H = S = w_hh0.shape[1]
    for k in range(num_layers * dirs):
        in_k = input_size if k < dirs else dirs * S
        expect = [(G * H, in_k), (G * H, S)] + ([(G * H,), (G * H,)] if has_bias else []) + ([(S, H)] if proj else [])
        group = checked[k * per:(k + 1) * per]
        for j, a in enumerate(group):
            if a.shape != expect[j]:
                raise _shape_error(op, _weight_label(names, as_dict, k * per + j), a.shape, expect[j],
                                   k < dirs and j == 0)
    return _flat([np.ascontiguousarray(a) for a in checked], num_layers * dirs, has_bias, proj), H


def _state(op, name, h, shape, dtype):
    if h is None:
        return None
    a = _array(op, name, h)
    if a.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {a.dtype} but input has {dtype}; all arrays must share one dtype")
    if a.shape != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {a.shape}")
    return np.ascontiguousarray(a)


# ---------------------------------------------------------------------------------------------- sequences
def _sequence_stack(op, mode, xt, h0, c0, flat, p_drop, rng, dims, has_bias, recompute, algo):
    """A training forward as a stack of one-layer calls of the fused kernel, for dropout between layers
    and for recompute. With dropout (p_drop > 0) the output of each layer but the last is multiplied by a
    fresh keep mask scaled by 1/(1-p) (all zeros when p = 1), as torch.nn.LSTM(dropout=p) does in training
    mode. With recompute, no gate activations are saved: the backward recomputes them one layer at a time.
    Returns (out, h_n, c_n, the one-layer reserves, the masks)."""
    T, B, I, H, L, D, P = dims
    S, per = P or H, 5 if P else 4  # the size of h; kernel weights per layer-direction
    dtype = xt.dtype
    h_n = _empty(op, (L * D, B, S), dtype)
    c_n = _empty(op, (L * D, B, H), dtype) if mode == "lstm" else None
    stack, masks = [], []
    inp = xt
    for layer in range(L):
        k0, k1 = layer * D, (layer + 1) * D
        il = I if layer == 0 else D * S
        shape = (_CELL_CODES[mode], T, B, il, H, 1, D, P)
        out = _empty(op, (T, B, D * S), dtype)
        buffer = None if recompute else _empty(op, (_reserve_elems(shape),), dtype)
        w = flat[per * k0:per * k1]
        h0_l = None if h0 is None else h0[k0:k1]
        c0_l = None if c0 is None else c0[k0:k1]
        p = _problem(op, mode, T, B, il, H, 1, D, has_bias, "fwd", dtype, P)
        _plan(op, p, algo).run(inp, h0_l, c0_l, w, out=[out], h_n=h_n[k0:k1],
                               c_n=None if c_n is None else c_n[k0:k1], reserve=buffer)
        stack.append(RnnReserve(op=op, mode=mode, cell=False, shape=shape, problem=p, x=inp, h0=h0_l, c0=c0_l,
                                weights=w, names=None, as_dict=False, has_bias=has_bias, ys=[out], buffer=buffer,
                                batch_first=False, unbatched=False))
        if layer == L - 1:
            return out, h_n, c_n, stack, masks
        if p_drop == 0.0:
            inp = out
            continue
        if p_drop < 1.0:
            mask = (rng.random(out.shape, dtype=dtype) >= p_drop).astype(dtype)
            mask *= dtype.type(1.0 / (1.0 - p_drop))
        else:
            mask = np.zeros(out.shape, dtype)
        masks.append(mask)
        inp = out * mask


def _sequence(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, train, dropout=0.0,
              generator=None, recompute=False, proj_size=0, algo="auto", stream=None):
    if stream is not None and device_of(x) != "cuda":
        raise TypeError(f"{op}: stream is for GPU arrays; the input is on the host")
    try:
        return _sequence_on_host(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, train,
                                 dropout, generator, recompute, proj_size, algo)
    except DeviceArray:
        if device_of(x) != "cuda":
            raise placement_error(op, input=x, h0=h0, c0=c0, weights=weights) from None
        from . import gpu_recurrent

        return gpu_recurrent.sequence(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, train,
                                      dropout, generator, recompute, proj_size, algo, stream)


def _sequence_args(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size):
    """A host sequence call's arguments checked, and its problem: (problem, x as (T, B, I), h0, c0, the
    kernel's flat weights, names, as_dict, has_bias, unbatched, batch_first). lstm/gru/rnn and explain."""
    num_layers = _layers(op, num_layers)
    P = _proj_size(op, mode, proj_size)
    dirs = 2 if _flag(op, "bidirectional", bidirectional) else 1
    batch_first = _flag(op, "batch_first", batch_first)
    x = _array(op, "input", x, ndim=(2, 3))
    unbatched = x.ndim == 2
    xt = x[:, None, :] if unbatched else (x.transpose(1, 0, 2) if batch_first else x)  # (T, B, I)
    T, B, I = xt.shape
    if T < 1:
        raise ValueError(f"{op}: input must have a sequence length >= 1, got shape {x.shape}")
    if I < 1:
        raise ValueError(f"{op}: input must have a feature size (its last dimension) >= 1, got shape {x.shape}")
    arrays, names, as_dict, has_bias = _weights(op, weights, num_layers, dirs, P > 0)
    flat, H = _check_weights(op, mode, arrays, names, as_dict, has_bias, x.dtype, I, num_layers, dirs, P)
    S = P or H  # the size of h
    lead = (num_layers * dirs,) if unbatched else (num_layers * dirs, B)
    h0 = _state(op, "h0", h0, lead + (S,), x.dtype)
    c0 = _state(op, "c0", c0, lead + (H,), x.dtype) if mode == "lstm" else None
    p = _problem(op, mode, T, B, I, H, num_layers, dirs, has_bias, "fwd", x.dtype, P)
    return p, xt, h0, c0, flat, names, as_dict, has_bias, unbatched, batch_first


def _sequence_key(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size):
    """A sequence call's signature in _calls (its cell, the arrays' shapes and dtypes, C-contiguous NumPy arrays all,
    the weights' keys or count, the shaping arguments), or None where it is not one to remember. A hit holds
    what _sequence_args found: a call repeated on arrays alike skips the checks that only shapes decide."""
    if type(num_layers) is not int or type(bidirectional) is not bool or type(batch_first) is not bool or \
            type(proj_size) is not int:
        return None
    try:
        ws = tuple((k, _sig(v)) for k, v in weights.items()) if type(weights) is dict else \
            tuple(_sig(w) for w in weights) if type(weights) in (list, tuple) else None
        return None if ws is None else ("seq", op, mode, _sig(x), _sig(h0), _sig(c0), ws, num_layers, bidirectional,
                                        batch_first, proj_size)
    except AttributeError:
        return None


def _sequence_on_host(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, train, dropout,
                      generator, recompute, proj_size, algo):
    key = _sequence_key(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size)
    hit = None if key is None else _calls.get(key)
    if hit is not None:  # the arrays are C-contiguous ones of the shapes and dtypes checked before
        p, names, as_dict, has_bias, unbatched = hit
        xt = x[:, None, :] if unbatched else (x.transpose(1, 0, 2) if batch_first else x)
        flat = _flat([weights[k] for k in names] if as_dict else list(weights), p.layers * p.dirs, has_bias, p.proj)
    else:
        p, xt, h0, c0, flat, names, as_dict, has_bias, unbatched, batch_first = _sequence_args(
            op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, proj_size)
        if key is not None:
            _calls.put(key, (p, names, as_dict, has_bias, unbatched))
    p_drop = _dropout(op, dropout)
    recompute = _flag(op, "recompute", recompute)
    train = _flag(op, "train", train)
    T, B, I, H, num_layers, dirs, P = p.seq, p.batch, p.input, p.hidden, p.layers, p.dirs, p.proj
    S = P or H
    xt = np.ascontiguousarray(xt)
    shape = (_CELL_CODES[mode], T, B, I, H, num_layers, dirs, P)
    stack = masks = None
    if train and ((p_drop > 0.0 and num_layers > 1) or recompute):
        rng = _generator(op, generator) if p_drop > 0.0 and num_layers > 1 else None
        out, h_n, c_n, stack, masks = _sequence_stack(op, mode, xt, h0, c0, flat, p_drop if rng else 0.0, rng,
                                                      (T, B, I, H, num_layers, dirs, P), has_bias, recompute, algo)
        ys, buffer = [r.ys[0] for r in stack], None
    else:
        out = _empty(op, (T, B, dirs * S), xt.dtype)
        if train:
            ys = [_empty(op, (T, B, dirs * S), xt.dtype) for _ in range(num_layers - 1)] + [out]
            buffer = _empty(op, (_reserve_elems(shape),), xt.dtype)
        else:
            tmp = [_empty(op, (T, B, dirs * S), xt.dtype) for _ in range(min(num_layers - 1, 2))]
            ys = [tmp[layer % 2] for layer in range(num_layers - 1)] + [out]
            buffer = None
        h_n = _empty(op, (num_layers * dirs, B, S), xt.dtype)
        c_n = _empty(op, (num_layers * dirs, B, H), xt.dtype) if mode == "lstm" else None
        _plan(op, p, algo).run(xt, h0, c0, flat, out=ys, h_n=h_n, c_n=c_n, reserve=buffer)
    if unbatched:
        output, h_n = out[:, 0, :], h_n[:, 0, :]
        c_n = None if c_n is None else c_n[:, 0, :]
    else:
        output = out.transpose(1, 0, 2) if batch_first else out
    state = (h_n, c_n) if mode == "lstm" else h_n
    if not train:
        return output, state
    reserve = RnnReserve(op=op, mode=mode, cell=False, shape=shape, problem=p, x=xt, h0=h0, c0=c0, weights=flat,
                         names=names, as_dict=as_dict, has_bias=has_bias, ys=ys, buffer=buffer,
                         batch_first=batch_first, unbatched=unbatched, stack=stack, masks=masks)
    return output, state, reserve


def lstm(x, h0, c0, weights, *, num_layers=1, bidirectional=False, batch_first=False, train=False, dropout=0.0,
         generator=None, recompute=False, proj_size=0, algo="auto", stream=None):
    """torch.nn.LSTM's forward: returns (output, (h_n, c_n)), and a reserve for lstm_backward when train.

    x: (T, B, I), or (B, T, I) with batch_first, or (T, I) unbatched; h0, c0: (num_layers*D, B, H) or
    None (zeros); weights: see the module docstring. output: (T, B, D*H) (batch_first: (B, T, D*H));
    h_n, c_n: (num_layers*D, B, H). D = 2 when bidirectional (forward and reverse halves of output's
    last dimension, in that order). dropout: as torch.nn.LSTM's, applied to the output of every layer
    but the last when train is true (ignored otherwise); the masks come from `generator` (None, an int
    seed or a numpy.random.Generator) and are kept in the reserve (RnnReserve.dropout_masks).
    recompute (with train): save no gate activations; lstm_backward recomputes them one layer at a time
    (memory: one layer-direction's activations at the peak instead of all of them; time: one more forward).
    proj_size P > 0: torch.nn.LSTM's projections, h_t = W_hr (o * tanh(c_t)); output (T, B, D*P), h0 and
    h_n (num_layers*D, B, P), weights with weight_hr_l{k} (P, H) after each layer-direction's biases.
    algo: "auto" (dispatch: the tuning cache, else the kernel's rule) or how the threads share the time loop:
    "fused" (the kernel's rule), "fused_units", "fused_rows", "fused_wavefront", "fused_amx" (see
    dnnkit.explain("lstm_l2t50mb16slc512sic512") for which can run a shape, and why not). Training with
    dropout between layers, or with recompute, runs the layers one call each: no wavefront there.
    GPU arrays (CuPy, PyTorch CUDA tensors, Numba) run on the GPU (algo "gpu_steps", "gpu_wavefront" or
    "gpu_persistent"; train=True, recompute and lstm_backward too), on `stream` or the caller's current
    stream; results are arrays of the input's kind."""
    return _sequence("lstm", "lstm", x, h0, c0, weights, num_layers, bidirectional, batch_first, train, dropout,
                     generator, recompute, proj_size, algo, stream)


def gru(x, h0, weights, *, num_layers=1, bidirectional=False, batch_first=False, train=False, dropout=0.0,
        generator=None, recompute=False, algo="auto", stream=None):
    """torch.nn.GRU's forward: returns (output, h_n), and a reserve for gru_backward when train. dropout,
    generator, recompute, algo and stream as for lstm."""
    return _sequence("gru", "gru", x, h0, None, weights, num_layers, bidirectional, batch_first, train, dropout,
                     generator, recompute, 0, algo, stream)


def rnn(x, h0, weights, *, nonlinearity="tanh", num_layers=1, bidirectional=False, batch_first=False, train=False,
        dropout=0.0, generator=None, recompute=False, algo="auto", stream=None):
    """torch.nn.RNN's forward (nonlinearity 'tanh' or 'relu'): returns (output, h_n), and a reserve for
    rnn_backward when train. dropout, generator, recompute, algo and stream as for lstm."""
    return _sequence("rnn", _rnn_mode(nonlinearity), x, h0, None, weights, num_layers, bidirectional, batch_first,
                     train, dropout, generator, recompute, 0, algo, stream)


def _reserve(op, reserve, modes, cell):
    if not isinstance(reserve, RnnReserve):
        raise TypeError(f"{op}: reserve must be the RnnReserve a forward with train=True returned, "
                        f"got {type(reserve).__name__}")
    if reserve.mode not in modes or reserve.cell != cell:
        raise ValueError(f"{op}: reserve comes from {reserve.op}, not from a matching forward")
    return reserve


def _grad(op, name, g, shape, dtype):
    """A C-contiguous gradient of `shape` (the forward's, in its layout), or None."""
    if g is None:
        return None
    try:
        a = _array(op, name, g)
    except DeviceArray:
        raise TypeError(f"{op}: {name} is on a CUDA device but the forward ran on the host (its reserve holds "
                        f"host arrays); pass all of a call's arrays on one device") from None
    if a.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {a.dtype} but the forward ran in {dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {a.shape}")
    return a


def _accumulate_targets(op, r: RnnReserve, into, returned_names, grads=()):
    """The arrays of `accumulate_into` in the kernel's order (r.weights: None for absent biases), checked
    against the weights they accumulate gradients of, and apart from every array the backward reads (the
    forward's saved arrays and grads, (label, array) pairs). `into` has the entries the call returns as weight
    gradients: `returned_names` names them (a cell's tuple holds None for absent biases)."""
    if into is None:
        return None
    present = [i for i, w in enumerate(r.weights) if w is not None]
    if isinstance(into, dict) and r.as_dict:
        missing = [k for k in returned_names if k not in into]
        extra = [k for k in into if k not in returned_names]
        if missing or extra:
            raise ValueError(f"{op}: accumulate_into must have exactly the keys {list(returned_names)}; missing "
                             f"{missing}, unexpected {extra}")
        entries = [into[k] for k in returned_names]
        labels = [f"accumulate_into[{k!r}]" for k in returned_names]
    else:
        if not isinstance(into, (list, tuple)):
            raise TypeError(f"{op}: accumulate_into must be a list or tuple of arrays like the weight gradients "
                            f"this call returns, got {type(into).__name__}")
        if len(into) != len(returned_names):
            raise ValueError(f"{op}: accumulate_into must hold {len(returned_names)} entries (the weight "
                             f"gradients this call returns), got {len(into)}")
        entries = list(into)
        labels = [f"accumulate_into[{i}]" for i in range(len(entries))]
    if r.cell:  # a cell's tuple: absent biases as None
        for e, label, w in zip(entries, labels, r.weights):
            if (e is None) != (w is None):
                raise ValueError(f"{op}: {label} must be None exactly where the forward had no bias")
        labels = [lb for e, lb in zip(entries, labels) if e is not None]
        entries = [e for e in entries if e is not None]
    targets = [None] * len(r.weights)
    for i, e, label in zip(present, entries, labels):
        targets[i] = _accumulate_target(op, label, e, r.weights[i].shape, r.x.dtype)
    read = [("the forward's input", r.x), ("the forward's h0", r.h0), ("the forward's c0", r.c0)]
    read += [(("the forward's weight", i), w) for i, w in enumerate(r.weights)]
    read += [(("the forward's output", i), y) for i, y in enumerate(r.ys or ())] + list(grads)
    _targets_apart(op, zip(labels, (targets[i] for i in present)), read)
    return targets


def _run_backward(op, r: RnnReserve, dy, dh_n, dc_n, into=None, algo="auto"):
    """The kernel on C-contiguous gradients in its own layout: (dx (T, B, I), dh0, dc0, flat grads). With
    `into` (arrays in the order of r.weights), the weight and bias gradients are added to those arrays,
    which are returned as the grads."""
    if r.stack:
        return _run_backward_stack(op, r, dy, dh_n, dc_n, into, algo)
    _, T, B, I, H, L, D, P = r.shape
    dtype = r.x.dtype
    dx = _empty(op, (T, B, I), dtype)
    dh0 = _empty(op, (L * D, B, P or H), dtype)
    dc0 = _empty(op, (L * D, B, H), dtype) if r.mode == "lstm" else None
    if into is None:
        grads = [None if w is None else _empty(op, w.shape, dtype) for w in r.weights]
    else:
        grads = list(into)
    fp = r.problem
    p = _problem(op, fp.mode, fp.seq, fp.batch, fp.input, fp.hidden, fp.layers, fp.dirs, fp.bias, "bwd", dtype, fp.proj)
    _plan(op, p, algo).run(r.x, r.h0, r.c0, r.weights, r.ys, r.buffer, dy, dh_n, dc_n,
                           out=(dx, dh0, dc0, grads), accumulate=into is not None)
    return dx, dh0, dc0, grads


def _recompute(op, r: RnnReserve) -> RnnReserve:
    """A one-layer reserve with its gate activations, recomputed by running the layer's forward again on
    the input it had (the same arithmetic, so the same values as a forward that saved them)."""
    _, T, B, I, H, _, D, P = r.shape
    dtype = r.x.dtype
    buffer = _empty(op, (_reserve_elems(r.shape),), dtype)
    out = _empty(op, (T, B, D * (P or H)), dtype)
    p = r.problem
    _plan(op, p, "auto").run(r.x, r.h0, r.c0, r.weights, out=[out], h_n=_empty(op, (D, B, P or H), dtype),
                               c_n=_empty(op, (D, B, H), dtype) if r.mode == "lstm" else None, reserve=buffer)
    return RnnReserve(op=r.op, mode=r.mode, cell=False, shape=r.shape, problem=p, x=r.x, h0=r.h0, c0=r.c0,
                      weights=r.weights, names=None, as_dict=False, has_bias=r.has_bias, ys=[out], buffer=buffer,
                      batch_first=False, unbatched=False)


def _run_backward_stack(op, r: RnnReserve, dy, dh_n, dc_n, into=None, algo="auto"):
    """Backward of a forward with dropout: the one-layer reserves from the top down, the gradient that
    reaches each layer's output multiplied by the mask its output went through."""
    _, T, B, I, H, L, D, P = r.shape
    dtype = r.x.dtype
    dh0 = _empty(op, (L * D, B, P or H), dtype)
    dc0 = _empty(op, (L * D, B, H), dtype) if r.mode == "lstm" else None
    grads = []
    for layer in reversed(range(L)):
        k0, k1 = layer * D, (layer + 1) * D
        dh = None if dh_n is None else dh_n[k0:k1]
        dc = None if dc_n is None else dc_n[k0:k1]
        sub = r.stack[layer]
        if sub.buffer is None:
            sub = _recompute(op, sub)
        per = len(sub.weights)  # the layer's entries of the flat list
        dx, dh0[k0:k1], dc0_l, g = _run_backward(op, sub, dy, dh, dc,
                                                 None if into is None else into[layer * per:(layer + 1) * per], algo)
        if dc0 is not None:
            dc0[k0:k1] = dc0_l
        grads = g + grads
        if layer > 0:
            dy = dx * r.masks[layer - 1] if r.masks else dx
    return dx, dh0, dc0, grads


def _backward(op, r: RnnReserve, grad_output, grad_h_n, grad_c_n, into=None, algo="auto"):
    """Sequences: the user's gradients (in the forward's layouts) checked and brought to the kernel's."""
    return _run_backward(op, r, *_sequence_grads(op, r, grad_output, grad_h_n, grad_c_n), into, algo)


def _sequence_grads(op, r: RnnReserve, grad_output, grad_h_n, grad_c_n):
    """(dy, dh_n, dc_n): a sequence backward's gradients checked against its forward's layouts, C-contiguous
    in the kernel's, None where not given. The backward and explain."""
    _, T, B, I, H, L, D, P = r.shape
    S = P or H
    dtype = r.x.dtype
    if r.unbatched:
        out_shape, lead = (T, D * S), (L * D,)
    else:
        out_shape = (B, T, D * S) if r.batch_first else (T, B, D * S)
        lead = (L * D, B)
    dy = _grad(op, "grad_output", grad_output, out_shape, dtype)
    if dy is not None:
        dy = dy.reshape(T, 1, D * S) if r.unbatched else (dy.transpose(1, 0, 2) if r.batch_first else dy)
        dy = np.ascontiguousarray(dy)
    dh_n = _grad(op, "grad_h_n", grad_h_n, lead + (S,), dtype)
    dc_n = _grad(op, "grad_c_n", grad_c_n, lead + (H,), dtype) if r.mode == "lstm" else None
    dh_n = None if dh_n is None else np.ascontiguousarray(dh_n)
    dc_n = None if dc_n is None else np.ascontiguousarray(dc_n)
    return dy, dh_n, dc_n


def _sequence_backward(op, modes, grad_output, grad_h_n, grad_c_n, reserve, accumulate_into, algo):
    if type(reserve).__name__ == "GpuRnnReserve":
        from . import gpu_recurrent

        if reserve.mode not in modes or reserve.cell:
            raise ValueError(f"{op}: the reserve is from a {reserve.op} forward")
        return gpu_recurrent.backward(op, reserve, grad_output, grad_h_n, grad_c_n, accumulate_into, algo)
    r = _reserve(op, reserve, modes, cell=False)
    names = r.names if r.as_dict else range(sum(w is not None for w in r.weights))
    into = _accumulate_targets(op, r, accumulate_into, list(names),
                               (("grad_output", grad_output), ("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n)))
    dx, dh0, dc0, grads = _backward(op, r, grad_output, grad_h_n, grad_c_n, into, algo)
    if r.unbatched:
        dx, dh0 = dx[:, 0, :], dh0[:, 0, :]
        dc0 = None if dc0 is None else dc0[:, 0, :]
    elif r.batch_first:
        dx = dx.transpose(1, 0, 2)
    flat = [g for g in grads if g is not None]  # the kernel's None entries are the absent biases
    weights = dict(zip(r.names, flat)) if r.as_dict else flat
    return (dx, dh0, dc0, weights) if r.mode == "lstm" else (dx, dh0, weights)


def lstm_backward(grad_output, grad_h_n, grad_c_n, reserve, *, accumulate_into=None, algo="auto"):
    """Backward through time of lstm(..., train=True): returns (grad_x, grad_h0, grad_c0, grad_weights),
    each in the layout of the forward's argument; grad_weights a list or dict like the forward's weights.

    accumulate_into: arrays laid out as grad_weights (a list, or a dict with the same keys; C-contiguous,
    of the weights' shapes and dtype); the weight and bias gradients are added to them in place, as
    autograd adds into ``.grad`` and cuDNN's weight backward into dw, and they are returned as
    grad_weights. Gradients summed over micro-batches, or over the steps of a cell stepped in a loop,
    then cost no extra pass. algo: as for lstm (explain("lstm_backward", grad_output, None, None, reserve)
    lists them; no wavefront)."""
    return _sequence_backward("lstm_backward", ("lstm",), grad_output, grad_h_n, grad_c_n, reserve, accumulate_into,
                              algo)


def gru_backward(grad_output, grad_h_n, reserve, *, accumulate_into=None, algo="auto"):
    """Backward through time of gru(..., train=True): returns (grad_x, grad_h0, grad_weights);
    accumulate_into and algo as for lstm_backward."""
    return _sequence_backward("gru_backward", ("gru",), grad_output, grad_h_n, None, reserve, accumulate_into, algo)


def rnn_backward(grad_output, grad_h_n, reserve, *, accumulate_into=None, algo="auto"):
    """Backward through time of rnn(..., train=True): returns (grad_x, grad_h0, grad_weights);
    accumulate_into and algo as for lstm_backward."""
    return _sequence_backward("rnn_backward", ("rnn_tanh", "rnn_relu"), grad_output, grad_h_n, None, reserve,
                              accumulate_into, algo)


# -------------------------------------------------------------------------------------------------- cells
def _cell_array(op, name, a, dtype):
    if type(a) is not np.ndarray or a.dtype not in _FLOAT_DTYPES:
        a = _array(op, name, a)
    if a.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {a.dtype} but input has {dtype}; all arrays must share one dtype")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _sig(a):
    """(shape, dtype) of a C-contiguous ndarray, None for None; raises AttributeError for anything else
    (the caller then takes the checked path)."""
    if a is None:
        return None
    if type(a) is PackedWeight:
        return "packed", a.shape, a.dtype
    if type(a) is not np.ndarray or not a.flags.c_contiguous:
        raise AttributeError
    return a.shape, a.dtype


def _cell_key(op, x, h, c, w_ih, w_hh, b_ih, b_hh, train, algo):
    """A cell call's signature in _calls (every array's shape and dtype, which state was given, train, algo),
    or None where it is not one to remember. A hit holds (plan, kernel shape, unbatched): a cell stepped in a
    Python loop repeats one signature."""
    if type(train) is not bool or type(algo) is not str:
        return None
    try:
        return (op, train, algo, _sig(x), _sig(h), _sig(c), _sig(w_ih), _sig(w_hh), _sig(b_ih), _sig(b_hh),
                dispatch_state())
    except AttributeError:
        return None


def _cell_run(op, mode, hit, x, h, c, flat, train):
    plan, shape, unbatched = hit
    B, H = shape[2], shape[4]
    h_out = _empty(op, (B, H), x.dtype)
    c_out = _empty(op, (B, H), x.dtype) if mode == "lstm" else None
    buffer = _empty(op, (_reserve_elems(shape),), x.dtype) if train else None
    plan.run(x, h, c, flat, out=[h_out], h_n=None, c_n=c_out, reserve=buffer)
    return h_out, c_out, buffer


def _cell(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh, train, algo):
    """One step of a single-layer, one-direction sequence (the same kernel, which skips the packing)."""
    key = _cell_key(op, x, h, c, w_ih, w_hh, b_ih, b_hh, train, algo)
    hit = None if key is None else _calls.get(key)
    if hit is not None:
        h_out, c_out, buffer = _cell_run(op, mode, hit, x, h, c, [w_ih, w_hh, b_ih, b_hh], train)
        return _cell_result(op, mode, hit[0].problem, hit[1], hit[2], x, h, c, [w_ih, w_hh, b_ih, b_hh], h_out,
                            c_out, buffer, train)
    try:
        return _cell_checked(op, mode, key, x, h, c, w_ih, w_hh, b_ih, b_hh, train, algo)
    except DeviceArray:
        if device_of(x) == "cuda" and not any(isinstance(w, PackedWeight) for w in (w_ih, w_hh)):
            from . import gpu_recurrent

            return gpu_recurrent.cell(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh, train, algo)
        names = ("hx[0]", "hx[1]") if mode == "lstm" else ("hx", "")
        raise placement_error(op, input=x, **{names[0]: h}, **({names[1]: c} if c is not None else {}), w_ih=w_ih,
                              w_hh=w_hh, b_ih=b_ih, b_hh=b_hh) from None


def _cell_args(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """A host cell call's arguments checked, and its problem: (problem, x, h, c, flat weights, the kernel's
    shape, unbatched). The cells and explain."""
    x = _array(op, "input", x, ndim=(1, 2))
    dtype = x.dtype
    unbatched = x.ndim == 1
    B, I = (1, x.shape[0]) if unbatched else x.shape
    if I < 1:
        raise ValueError(f"{op}: input must have a feature size (its last dimension) >= 1, got shape {x.shape}")
    G = RNN_GATES[mode]
    packed = [isinstance(w, PackedWeight) for w in (w_ih, w_hh)]
    if any(packed):
        if not all(packed):
            raise ValueError(f"{op}: w_ih and w_hh must both be packed (dnnkit.pack_weight) or both be arrays")
        for name, w in (("w_ih", w_ih), ("w_hh", w_hh)):
            if w.dtype != dtype:
                raise TypeError(f"{op}: {name} has dtype {w.dtype} but input has {dtype}; all arrays must share "
                                f"one dtype")
    else:
        w_ih = _cell_array(op, "w_ih", w_ih, dtype)
        w_hh = _cell_array(op, "w_hh", w_hh, dtype)
    if len(w_hh.shape) != 2 or w_hh.shape[1] < 1 or w_hh.shape[0] != G * w_hh.shape[1]:
        raise ValueError(f"{op}: w_hh must have shape ({G}*hidden_size, hidden_size) with hidden_size >= 1, "
                         f"got {w_hh.shape}")
    H = w_hh.shape[1]
    if w_ih.shape != (G * H, I):
        raise ValueError(f"{op}: w_ih must have shape {(G * H, I)} (input has {I} features), got {w_ih.shape}")
    if (b_ih is None) != (b_hh is None):
        raise ValueError(f"{op}: b_ih and b_hh must both be given or both be None")
    if b_ih is not None:
        b_ih = _cell_array(op, "b_ih", b_ih, dtype)
        b_hh = _cell_array(op, "b_hh", b_hh, dtype)
        for name, b in (("b_ih", b_ih), ("b_hh", b_hh)):
            if b.shape != (G * H,):
                raise ValueError(f"{op}: {name} must have shape {(G * H,)}, got {b.shape}")
    state_shape = (H,) if unbatched else (B, H)
    names = ("hx[0]", "hx[1]") if mode == "lstm" else ("hx", None)
    if h is not None:
        h = _cell_array(op, names[0], h, dtype)
        if h.shape != state_shape:
            raise ValueError(f"{op}: {names[0]} must have shape {state_shape}, got {h.shape}")
    if c is not None:
        c = _cell_array(op, names[1], c, dtype)
        if c.shape != state_shape:
            raise ValueError(f"{op}: {names[1]} must have shape {state_shape}, got {c.shape}")
    x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    p = _problem(op, mode, 1, B, I, H, 1, 1, b_ih is not None, "fwd", dtype)
    return p, x, h, c, [w_ih, w_hh, b_ih, b_hh], (_CELL_CODES[mode], 1, B, I, H, 1, 1, 0), unbatched


def _cell_checked(op, mode, key, x, h, c, w_ih, w_hh, b_ih, b_hh, train, algo):
    """_cell for a call not seen before: the checks, the dispatch, the run, and the call remembered."""
    p, x, h, c, flat, shape, unbatched = _cell_args(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh)
    train = _flag(op, "train", train)
    hit = (_plan(op, p, algo), shape, unbatched)
    h_out, c_out, buffer = _cell_run(op, mode, hit, x, h, c, flat, train)
    if key is not None:
        _calls.put(key, hit)
    return _cell_result(op, mode, p, shape, unbatched, x, h, c, flat, h_out, c_out, buffer, train)


def _cell_result(op, mode, p, shape, unbatched, x, h, c, flat, h_out, c_out, buffer, train):
    B, H = shape[2], shape[4]
    if unbatched:
        h_out = h_out[0]
        c_out = None if c_out is None else c_out[0]
    result = (h_out, c_out) if mode == "lstm" else h_out
    if not train:
        return result
    flat = [unpacked(w) for w in flat]  # backward multiplies by the arrays themselves
    reserve = RnnReserve(op=op, mode=mode, cell=True, shape=shape, problem=p, x=x, h0=h, c0=c, weights=flat, names=None,
                         as_dict=False, has_bias=flat[2] is not None, ys=[h_out.reshape(1, B, H)], buffer=buffer,
                         batch_first=False, unbatched=unbatched)
    return result, reserve


def lstm_cell(x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto"):
    """torch.nn.LSTMCell's forward: (h', c') from x (B, I) or (I,), hx = (h, c) of (B, H) or (H,), or
    None (zeros); w_ih (4H, I), w_hh (4H, H), biases (4H,) or None. With train, ((h', c'), reserve).
    w_ih and w_hh may both be weights packed once by dnnkit.pack_weight (a cell stepped in a loop then
    packs nothing per call); so for every cell. algo: "auto" (the tuning cache, else the kernel's rule)
    or how the step's products run: "fused" (the kernel's rule), "fused_cell_direct",
    "fused_cell_dots", "fused_cell_gemm" (docs/algorithms.md; without hx, or on packed weights, the step
    runs the general way whatever is named)."""
    return _cell("lstm_cell", "lstm", x, *_lstm_hx(hx), w_ih, w_hh, b_ih, b_hh, train, algo)


def gru_cell(x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto"):
    """torch.nn.GRUCell's forward: h' (gates r, z, n of w_ih's rows). With train, (h', reserve). algo as
    for lstm_cell."""
    return _cell("gru_cell", "gru", x, hx, None, w_ih, w_hh, b_ih, b_hh, train, algo)


def rnn_tanh_cell(x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto"):
    """torch.nn.RNNCell's forward with tanh: h' = tanh(x w_ih^T + b_ih + h w_hh^T + b_hh). algo as for
    lstm_cell."""
    return _cell("rnn_tanh_cell", "rnn_tanh", x, hx, None, w_ih, w_hh, b_ih, b_hh, train, algo)


def rnn_relu_cell(x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, train=False, algo="auto"):
    """torch.nn.RNNCell's forward with ReLU. algo as for lstm_cell."""
    return _cell("rnn_relu_cell", "rnn_relu", x, hx, None, w_ih, w_hh, b_ih, b_hh, train, algo)


def _cell_grads(op, r: RnnReserve, grad_h, grad_c):
    """(dh, dc) of a cell's backward checked against its forward's state shape, as (1, B, H), None where
    not given: h' is the step's output (grad_output of a one-step sequence), c' its final cell state."""
    _, _, B, _, H, _, _, _ = r.shape
    state = (H,) if r.unbatched else (B, H)
    dh = _grad(op, "grad_h", grad_h, state, r.x.dtype)
    dc = _grad(op, "grad_c", grad_c, state, r.x.dtype) if r.mode == "lstm" else None
    dh = None if dh is None else np.ascontiguousarray(dh).reshape(1, B, H)
    dc = None if dc is None else np.ascontiguousarray(dc).reshape(1, B, H)
    return dh, dc


def _cell_backward(op, modes, grad_h, grad_c, reserve, accumulate_into):
    if type(reserve).__name__ == "GpuRnnReserve":
        from . import gpu_recurrent

        if reserve.mode not in modes or not reserve.cell:
            raise ValueError(f"{op}: the reserve is from a {reserve.op} forward")
        return gpu_recurrent.cell_backward(op, reserve, grad_h, grad_c, accumulate_into)
    r = _reserve(op, reserve, modes, cell=True)
    into = _accumulate_targets(op, r, accumulate_into, ["grad_w_ih", "grad_w_hh", "grad_b_ih", "grad_b_hh"],
                               (("grad_h", grad_h), ("grad_c", grad_c)))
    dh, dc = _cell_grads(op, r, grad_h, grad_c)
    dx, dh0, dc0, grads = _run_backward(op, r, dh, None, dc, into)
    dx, dh0 = dx[0], dh0[0]
    dc0 = None if dc0 is None else dc0[0]
    if r.unbatched:
        dx, dh0 = dx[0], dh0[0]
        dc0 = None if dc0 is None else dc0[0]
    head = (dx, dh0, dc0) if r.mode == "lstm" else (dx, dh0)
    return head + tuple(grads)


def lstm_cell_backward(grad_h, grad_c, reserve, *, accumulate_into=None):
    """Gradients of lstm_cell(..., train=True): (grad_x, grad_h, grad_c, grad_w_ih, grad_w_hh, grad_b_ih,
    grad_b_hh), grad_h and grad_c with respect to hx; the bias gradients None without biases.

    accumulate_into: (grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh) arrays (the biases' None without
    biases) to which the weight and bias gradients are added in place and which are returned: a cell
    stepped over time in a loop sums its weight gradients over the steps without a pass of its own."""
    return _cell_backward("lstm_cell_backward", ("lstm",), grad_h, grad_c, reserve, accumulate_into)


def gru_cell_backward(grad_h, reserve, *, accumulate_into=None):
    """Gradients of gru_cell(..., train=True): (grad_x, grad_h, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh);
    accumulate_into as for lstm_cell_backward."""
    return _cell_backward("gru_cell_backward", ("gru",), grad_h, None, reserve, accumulate_into)


def rnn_cell_backward(grad_h, reserve, *, accumulate_into=None):
    """Gradients of rnn_tanh_cell or rnn_relu_cell(..., train=True), as gru_cell_backward."""
    return _cell_backward("rnn_cell_backward", ("rnn_tanh", "rnn_relu"), grad_h, None, reserve, accumulate_into)
