"""The GPU path of the RNN sequences (recurrent.py's lstm, gru and rnn given GPU arrays): the inference
forward, multi-layer and bidirectional, batch_first or not, batched or not, with torch.nn.LSTM's weights.

Arguments are checked as on the CPU, viewed as Numba device arrays without a copy, and run by the plan
dispatch makes for the RnnProblem on the GPU (algos/rnn_cuda.py). Training (train=True: the reserve, the
backward through time) and LSTM projections run on the CPU only so far; asked of GPU arrays, they are an
error that says so.
"""
from __future__ import annotations

from . import dispatch
from .backends import cuda as _cuda, device_of, placement_error
from ._checks import _flag
from ._rnn_args import _dropout, _layers, _proj_size, _weight_label, _weights
from .gpu_ops import _plan, _same_dtype
from .problem import RnnProblem

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _all_arrays(x, h0, c0, weights) -> list:
    ws = list(weights.values()) if isinstance(weights, dict) else list(weights) if isinstance(weights, (list, tuple)) \
        else []
    return [a for a in [x, h0, c0, *ws] if a is not None]


def sequence(op, mode, x, h0, c0, weights, num_layers, bidirectional, batch_first, train, dropout, generator,
             recompute, proj_size, algo, stream):
    if any(device_of(a) == "cpu" for a in _all_arrays(x, h0, c0, weights)):
        raise placement_error(op, input=x, h0=h0, c0=c0, weights=weights)
    L = _layers(op, num_layers)
    P = _proj_size(op, mode, proj_size)
    _dropout(op, dropout)
    _flag(op, "recompute", recompute)
    D = 2 if _flag(op, "bidirectional", bidirectional) else 1
    batch_first = _flag(op, "batch_first", batch_first)
    if _flag(op, "train", train):
        raise NotImplementedError(f"{op}: train=True on GPU arrays: the GPU runs the inference forward so far (no "
                                  f"reserve, no backward through time); pass NumPy arrays to train on the CPU")
    dx = _cuda.adopt(op, "input", x, ndim=(2, 3))
    shape = tuple(dx.shape)
    unbatched = len(shape) == 2
    if unbatched:
        T, B, I = shape[0], 1, shape[1]
    else:
        T, B, I = (shape[1], shape[0], shape[2]) if batch_first else shape
    if T < 1:
        raise ValueError(f"{op}: input must have a sequence length >= 1, got shape {shape}")
    if I < 1:
        raise ValueError(f"{op}: input must have a feature size (its last dimension) >= 1, got shape {shape}")
    if not _contiguous(dx):
        raise ValueError(f"{op}: input must be C-contiguous on the GPU (its steps are read as one matrix)")
    x3 = dx.reshape((T, 1, I)) if unbatched else dx
    arrays, names, as_dict, has_bias = _weights(op, weights, L, D, P > 0)
    dtype = _cuda.dtype_name(dx)
    ws = []
    for i, w in enumerate(arrays):
        d = _cuda.adopt(op, _weight_label(names, as_dict, i), w)
        ws.append(d)
    _same_dtype(op, input=dx, **{_weight_label(names, as_dict, i): w for i, w in enumerate(ws)})
    G = _GATES[mode]
    per = (4 if has_bias else 2) + (1 if P else 0)
    w_hh0 = tuple(ws[1].shape)
    if len(w_hh0) != 2 or w_hh0[0] != G * w_hh0[1] or w_hh0[1] < 1:
        raise ValueError(f"{op}: {_weight_label(names, as_dict, 1)} must be 2-D of shape ({G}*hidden_size, "
                         f"hidden_size) with hidden_size >= 1, got shape {w_hh0}")
    H = w_hh0[1]
    flat = []
    for k in range(L * D):
        in_k = I if k < D else D * H
        expect = [(G * H, in_k), (G * H, H)] + ([(G * H,), (G * H,)] if has_bias else [])
        group = ws[k * per:(k + 1) * per]
        for j, want in enumerate(expect):
            if tuple(group[j].shape) != want:
                raise ValueError(f"{op}: {_weight_label(names, as_dict, k * per + j)} must have shape {want}, got "
                                 f"{tuple(group[j].shape)}")
        flat += group[:2] + (group[2:4] if has_bias else [None, None])
    lead = (L * D,) if unbatched else (L * D, B)
    states = {}
    for name, h in (("h0", h0), ("c0", c0 if mode == "lstm" else None)):
        if h is not None:
            dh = _cuda.adopt(op, name, h)
            if _cuda.dtype_name(dh) != dtype:
                raise TypeError(f"{op}: {name} has dtype {dh.dtype} but input has {dtype}; all arrays must share "
                                f"one dtype")
            if tuple(dh.shape) != lead + (H,):
                raise ValueError(f"{op}: {name} must have shape {lead + (H,)}, got {tuple(dh.shape)}")
            states[name] = dh.reshape((L * D, 1, H)) if unbatched else dh
    p = RnnProblem(mode, T, B, I, H, layers=L, dirs=D, bias=has_bias, direction="fwd", dtype=dtype, device="cuda",
                   proj=P)
    plan = _plan(op, p, algo)
    s = _cuda.stream_for(op, stream, x)
    out_shape = (T, D * H) if unbatched else ((B, T, D * H) if batch_first else (T, B, D * H))
    out, dout = _cuda.empty(op, x, out_shape, dtype, s)
    h_n, dh_n = _cuda.empty(op, x, lead + (H,), dtype, s)
    c_n = dc_n = None
    if mode == "lstm":
        c_n, dc_n = _cuda.empty(op, x, lead + (H,), dtype, s)
    if unbatched:
        dout = dout.reshape((T, 1, D * H))
        dh_n = dh_n.reshape((L * D, 1, H))
        dc_n = None if dc_n is None else dc_n.reshape((L * D, 1, H))
    plan.run(x3, states.get("h0"), states.get("c0"), flat, out=dout, h_n=dh_n, c_n=dc_n,
             batch_first=batch_first and not unbatched, stream=s, gemm_plan=dispatch.plan)
    return out, ((h_n, c_n) if mode == "lstm" else h_n)


def _contiguous(d) -> bool:
    expect = d.dtype.itemsize
    for n, st in zip(reversed(tuple(d.shape)), reversed(tuple(d.strides))):
        if n > 1 and st != expect:
            return False
        expect *= n
    return True


def cell(op, mode, x, h, c, w_ih, w_hh, b_ih, b_hh, train, stream=None):
    """The cells (lstm_cell, gru_cell, rnn_*_cell) on GPU arrays: a one-step, one-layer sequence."""
    names = ("hx[0]", "hx[1]") if mode == "lstm" else ("hx", "c")
    arrays = {"input": x, names[0]: h, names[1]: c, "w_ih": w_ih, "w_hh": w_hh, "b_ih": b_ih, "b_hh": b_hh}
    if any(device_of(a) != "cuda" for a in arrays.values() if a is not None):
        raise placement_error(op, **{k: v for k, v in arrays.items() if v is not None})
    if _flag(op, "train", train):
        raise NotImplementedError(f"{op}: train=True on GPU arrays: the GPU runs the inference forward so far (no "
                                  f"reserve, no backward); pass NumPy arrays to train on the CPU")
    dx = _cuda.adopt(op, "input", x, ndim=(1, 2))
    unbatched = dx.ndim == 1
    B, I = (1, tuple(dx.shape)[0]) if unbatched else tuple(dx.shape)
    dtype = _cuda.dtype_name(dx)
    G = _GATES[mode]
    dw_ih = _cuda.adopt(op, "w_ih", w_ih, ndim=2)
    dw_hh = _cuda.adopt(op, "w_hh", w_hh, ndim=2)
    _same_dtype(op, input=dx, w_ih=dw_ih, w_hh=dw_hh)
    hh = tuple(dw_hh.shape)
    if hh[1] < 1 or hh[0] != G * hh[1]:
        raise ValueError(f"{op}: w_hh must have shape ({G}*hidden_size, hidden_size) with hidden_size >= 1, got {hh}")
    H = hh[1]
    if tuple(dw_ih.shape) != (G * H, I):
        raise ValueError(f"{op}: w_ih must have shape {(G * H, I)} (input has {I} features), got "
                         f"{tuple(dw_ih.shape)}")
    if (b_ih is None) != (b_hh is None):
        raise ValueError(f"{op}: b_ih and b_hh must both be given or both be None")
    biases = [None, None]
    if b_ih is not None:
        for i, (name, b) in enumerate((("b_ih", b_ih), ("b_hh", b_hh))):
            d = _cuda.adopt(op, name, b)
            _same_dtype(op, input=dx, **{name: d})
            if tuple(d.shape) != (G * H,):
                raise ValueError(f"{op}: {name} must have shape {(G * H,)}, got {tuple(d.shape)}")
            biases[i] = d
    state = (H,) if unbatched else (B, H)
    states = []
    for name, v in ((names[0], h), (names[1], c if mode == "lstm" else None)):
        if v is None:
            states.append(None)
            continue
        d = _cuda.adopt(op, name, v)
        _same_dtype(op, input=dx, **{name: d})
        if tuple(d.shape) != state:
            raise ValueError(f"{op}: {name} must have shape {state}, got {tuple(d.shape)}")
        states.append(d.reshape((1, B, H)))
    p = RnnProblem(mode, 1, B, I, H, bias=b_ih is not None, dtype=dtype, device="cuda")
    plan = _plan(op, p, "auto")
    s = _cuda.stream_for(op, stream, x)
    h_new, dh = _cuda.empty(op, x, state, dtype, s)
    dh3 = dh.reshape((1, B, H))
    c_new = dc3 = None
    if mode == "lstm":
        c_new, dc = _cuda.empty(op, x, state, dtype, s)
        dc3 = dc.reshape((1, B, H))
    plan.run(dx.reshape((1, B, I)), states[0], states[1], [dw_ih, dw_hh, *biases], out=dh3, h_n=dh3, c_n=dc3,
             stream=s, gemm_plan=dispatch.plan)
    return (h_new, c_new) if mode == "lstm" else h_new
