"""NumPy reference implementations: the test oracle.

Everything is computed in float64 from the inputs upcast, whatever their dtype, and returned as float64.
This module imports nothing of dnnkit, so a bug in dnnkit cannot leak into its own oracle.
"""
from __future__ import annotations

import math

import numpy as np

ACTIVATIONS = ("identity", "relu", "tanh", "sigmoid", "gelu")

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)  # math.erf element-wise (object dtype out; cast back below)


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(x), dtype=np.float64).reshape(x.shape)


def _act_name(name) -> str:
    name = "identity" if name is None else name
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")
    return name


# ------------------------------------------------------------------------------------------------- gemm
def gemm_ref(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False) -> np.ndarray:
    """alpha * op(a) @ op(b) + beta * c in float64, BLAS semantics: when beta == 0, c is not read (it may
    be None or hold NaN), so the result is alpha * op(a) @ op(b) exactly."""
    A = _f64(a).T if trans_a else _f64(a)  # M x K
    B = _f64(b).T if trans_b else _f64(b)  # K x N
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"gemm_ref: op(a) {A.shape} and op(b) {B.shape} do not multiply")
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf in the inputs propagate silently
        out = alpha * (A @ B)  # M x N
        if beta != 0.0:
            C = _f64(c)
            if C.shape != out.shape:
                raise ValueError(f"gemm_ref: c has shape {C.shape}, expected {out.shape}")
            out = out + beta * C
    return out


# ------------------------------------------------------------------------------------------ activations
def activation_ref(z, name) -> np.ndarray:
    """act(z) in float64; gelu is the exact form 0.5 * z * (1 + erf(z / sqrt(2))). NaN propagates."""
    z = _f64(z)
    name = _act_name(name)
    if name == "identity":
        return z.copy()
    if name == "relu":
        return np.where(z < 0.0, 0.0, z)  # keeps NaN, unlike a comparison that would map it to 0
    if name == "tanh":
        return np.tanh(z)
    if name == "sigmoid":
        with np.errstate(over="ignore"):  # exp(-z) -> inf for z << 0 gives the right limit 0
            return 1.0 / (1.0 + np.exp(-z))
    return 0.5 * z * (1.0 + _erf64(z * _SQRT_HALF))


def activation_grad_ref(z, name) -> np.ndarray:
    """d act(z) / dz in float64; relu's derivative at 0 is taken as 0."""
    z = _f64(z)
    name = _act_name(name)
    if name == "identity":
        return np.ones_like(z)
    if name == "relu":
        return np.where(z > 0.0, 1.0, 0.0)
    if name == "tanh":
        return 1.0 - np.tanh(z) ** 2
    if name == "sigmoid":
        s = activation_ref(z, "sigmoid")
        return s * (1.0 - s)
    cdf = 0.5 * (1.0 + _erf64(z * _SQRT_HALF))
    pdf = np.exp(-0.5 * z * z) * _INV_SQRT_2PI
    return cdf + z * pdf


# ----------------------------------------------------------------------------------------------- linear
def linear_ref(x, w, bias=None, activation=None) -> np.ndarray:
    """act(x @ w.T + bias), torch.nn.functional.linear semantics: x (..., in), w (out, in), bias (out,)."""
    x, w = _f64(x), _f64(w)
    z = x @ w.T  # (..., in) @ (in, out) -> (..., out); a 1-D x gives (out,)
    if bias is not None:
        z = z + _f64(bias)  # (out,) broadcast over the leading dimensions
    return activation_ref(z, activation)


def linear_backward_ref(grad_y, x, w, bias=True, activation=None, preactivation=None):
    """Gradients of y = act(x @ w.T + b) given dL/dy: returns (grad_x, grad_w, grad_b or None).

    preactivation: z = x @ w.T + b from the forward; required when the activation is not the identity
    (the reference does not get the bias values, so it cannot recompute z).
    """
    x, w, gy = _f64(x), _f64(w), _f64(grad_y)
    out_f, in_f = w.shape
    m = int(np.prod(x.shape[:-1], dtype=np.int64))
    x2 = x.reshape(m, in_f)  # (..., in) -> (M, in)
    gy2 = gy.reshape(m, out_f)  # (..., out) -> (M, out)
    name = _act_name(activation)
    if name == "identity":
        gz = gy2
    else:
        if preactivation is None:
            raise ValueError(f"linear_backward_ref: activation {name!r} needs the preactivation")
        z2 = _f64(preactivation).reshape(m, out_f)  # (..., out) -> (M, out)
        gz = gy2 * activation_grad_ref(z2, name)
    grad_x = (gz @ w).reshape(x.shape)  # (M, out) @ (out, in) -> (M, in) -> (..., in)
    grad_w = gz.T @ x2  # (out, M) @ (M, in) -> (out, in)
    grad_b = gz.sum(axis=0) if bias else None  # (out,)
    return grad_x, grad_w, grad_b


# ----------------------------------------------------------------------------------------------- conv2d
# NCHW throughout, with one set of letters: input (N, C, H, W), weight (K, C/G, R, S), output (N, K, P, Q);
# G groups, each mapping C/G input channels to K/G output channels. Each function loops over the R x S
# kernel offsets: offset (r, s) multiplies the strided window of the padded input that starts at
# (r * dilation_h, s * dilation_w) by the weight column w[:, :, r, s] -- a plain matrix product per group.
def _conv_pair(v, what) -> tuple[int, int]:
    pair = (v, v) if np.ndim(v) == 0 else tuple(v)
    if len(pair) != 2:
        raise ValueError(f"conv2d_ref: {what} must be an int or a pair, got {v!r}")
    return int(pair[0]), int(pair[1])


def _conv_geometry(input_shape, weight_shape, stride, padding, dilation, groups):
    """(sh, sw), (ph, pw), (dh, dw) and the output size (P, Q), checking the shapes fit together."""
    N, C, H, W = input_shape
    K, Cg, R, S = weight_shape
    (sh, sw), (ph, pw), (dh, dw) = (_conv_pair(stride, "stride"), _conv_pair(padding, "padding"),
                                    _conv_pair(dilation, "dilation"))
    if groups < 1 or C % groups or K % groups or Cg != C // groups:
        raise ValueError(f"conv2d_ref: input {tuple(input_shape)} and weight {tuple(weight_shape)} do not fit "
                         f"groups={groups}")
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError("conv2d_ref: stride and dilation must be >= 1, padding >= 0")
    P = (H + 2 * ph - dh * (R - 1) - 1) // sh + 1
    Q = (W + 2 * pw - dw * (S - 1) - 1) // sw + 1
    if P < 1 or Q < 1:
        raise ValueError(f"conv2d_ref: the kernel does not fit the padded input (output {P}x{Q})")
    return (sh, sw), (ph, pw), (dh, dw), (P, Q)


def _window(xp, r, s, stride, dilation, out_hw):
    """The (..., P, Q) strided view of the padded input xp (..., Hp, Wp) that kernel offset (r, s) reads:
    rows r*dh, r*dh + sh, ..., r*dh + (P-1)*sh, and the same for columns."""
    (sh, sw), (dh, dw), (P, Q) = stride, dilation, out_hw
    h0, w0 = r * dh, s * dw
    return xp[..., h0:h0 + (P - 1) * sh + 1:sh, w0:w0 + (Q - 1) * sw + 1:sw]


def conv2d_ref(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    """torch.nn.functional.conv2d in float64: x (N, C, H, W), w (K, C/G, R, S), bias (K,) or None;
    stride and dilation an int or a pair, padding an int or a pair (zeros on both sides).
    Returns (N, K, P, Q) with P = (H + 2*ph - dh*(R-1) - 1) // sh + 1 (likewise Q)."""
    x, w = _f64(x), _f64(w)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    stride, (ph, pw), dilation, (P, Q) = _conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    Kg = K // groups
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))  # (N, C, H + 2ph, W + 2pw)
    y = np.zeros((N, K, P, Q))
    for g in range(groups):
        xg = xp[:, g * Cg:(g + 1) * Cg]  # (N, C/G, Hp, Wp)
        wg = w[g * Kg:(g + 1) * Kg]  # (K/G, C/G, R, S)
        for r in range(R):
            for s in range(S):
                win = _window(xg, r, s, stride, dilation, (P, Q))  # (N, C/G, P, Q)
                # y[n, k, p, q] += sum_c w[k, c, r, s] * win[n, c, p, q]
                y[:, g * Kg:(g + 1) * Kg] += np.einsum("kc,ncpq->nkpq", wg[:, :, r, s], win)
    if bias is not None:
        y += _f64(bias).reshape(1, K, 1, 1)  # (K,) -> (1, K, 1, 1), broadcast over N, P, Q
    return y


def conv2d_backward_data_ref(input_shape, w, dy, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    """torch.nn.grad.conv2d_input in float64: dL/dx (N, C, H, W) of y = conv2d(x, w) given dy (N, K, P, Q).
    The adjoint of conv2d_ref in x: each kernel offset scatters w[:, :, r, s]^T @ dy back onto the window
    it read; what lands on the padding is dropped, and input rows/columns no window reads get zero."""
    w, dy = _f64(w), _f64(dy)
    N, C, H, W = (int(v) for v in input_shape)
    K, Cg, R, S = w.shape
    stride, (ph, pw), dilation, (P, Q) = _conv_geometry((N, C, H, W), w.shape, stride, padding, dilation, groups)
    if dy.shape != (N, K, P, Q):
        raise ValueError(f"conv2d_backward_data_ref: dy has shape {dy.shape}, expected {(N, K, P, Q)}")
    Kg = K // groups
    dxp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))  # gradient of the padded input
    for g in range(groups):
        dxg = dxp[:, g * Cg:(g + 1) * Cg]  # (N, C/G, Hp, Wp) view: writes land in dxp
        dyg = dy[:, g * Kg:(g + 1) * Kg]  # (N, K/G, P, Q)
        for r in range(R):
            for s in range(S):
                win = _window(dxg, r, s, stride, dilation, (P, Q))  # (N, C/G, P, Q) view into dxp
                # dx[n, c, window] += sum_k w[k, c, r, s] * dy[n, k, p, q]
                win += np.einsum("kc,nkpq->ncpq", w[g * Kg:(g + 1) * Kg, :, r, s], dyg)
    return dxp[:, :, ph:ph + H, pw:pw + W].copy()  # drop the padding: (N, C, H, W)


def conv2d_backward_filter_ref(x, weight_shape, dy, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    """torch.nn.grad.conv2d_weight in float64: dL/dw (K, C/G, R, S) of y = conv2d(x, w) given dy (N, K, P, Q).
    Each kernel offset's gradient is the correlation of dy with the window of the padded input it read."""
    x, dy = _f64(x), _f64(dy)
    N, C, H, W = x.shape
    K, Cg, R, S = (int(v) for v in weight_shape)
    stride, (ph, pw), dilation, (P, Q) = _conv_geometry(x.shape, (K, Cg, R, S), stride, padding, dilation, groups)
    if dy.shape != (N, K, P, Q):
        raise ValueError(f"conv2d_backward_filter_ref: dy has shape {dy.shape}, expected {(N, K, P, Q)}")
    Kg = K // groups
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))  # (N, C, H + 2ph, W + 2pw)
    dw = np.zeros((K, Cg, R, S))
    for g in range(groups):
        xg = xp[:, g * Cg:(g + 1) * Cg]  # (N, C/G, Hp, Wp)
        dyg = dy[:, g * Kg:(g + 1) * Kg]  # (N, K/G, P, Q)
        for r in range(R):
            for s in range(S):
                win = _window(xg, r, s, stride, dilation, (P, Q))  # (N, C/G, P, Q)
                # dw[k, c, r, s] = sum_{n, p, q} dy[n, k, p, q] * win[n, c, p, q]
                dw[g * Kg:(g + 1) * Kg, :, r, s] = np.einsum("nkpq,ncpq->kc", dyg, win)
    return dw


def conv2d_backward_bias_ref(dy) -> np.ndarray:
    """dL/dbias (K,) of y = conv2d(x, w, bias) given dy (N, K, P, Q): dy summed over N, P and Q."""
    dy = _f64(dy)
    if dy.ndim != 4:
        raise ValueError(f"conv2d_backward_bias_ref: dy must be 4-D (N, K, P, Q), got shape {dy.shape}")
    return dy.sum(axis=(0, 2, 3))


# ---------------------------------------------------------------------------------------------- metrics
def rel_l2(actual, expected) -> float:
    """Relative L2 error ||actual - expected|| / ||expected||, in float64.

    Non-finite values must match exactly: NaN where expected has NaN and nowhere else, and +-Inf where
    expected has the same +-Inf. Any mismatch returns inf (so every tolerance check fails); matching
    non-finite positions are left out of the norms. When ||expected|| == 0 the result is ||actual||
    (the absolute error), so an all-zero expectation still demands a (near) zero answer.
    Shapes must be equal (no broadcasting): a ValueError otherwise.
    """
    a, e = _f64(actual), _f64(expected)
    if a.shape != e.shape:
        raise ValueError(f"rel_l2: shapes differ: actual {a.shape}, expected {e.shape}")
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    if not np.array_equal(a_nan, e_nan):
        return math.inf
    a_inf, e_inf = np.isinf(a), np.isinf(e)
    if not np.array_equal(a_inf, e_inf) or not np.array_equal(a[a_inf], e[e_inf]):
        return math.inf
    finite = ~(e_nan | e_inf)
    diff = float(np.linalg.norm(a[finite] - e[finite]))
    norm = float(np.linalg.norm(e[finite]))
    return diff if norm == 0.0 else diff / norm


# ------------------------------------------------------------------------------------------------- RNNs
# Cells as torch.nn.LSTMCell / GRUCell / RNNCell: gate rows of w_ih and w_hh in the order i, f, g, o
# (LSTM) and r, z, n (GRU). Sequences as torch.nn.LSTM / GRU / RNN, time-major x (T, B, I), weights a
# flat list in the modules' parameter order (per layer, per direction: w_ih, w_hh[, b_ih, b_hh][, w_hr]).
# An LSTM with a projection (torch's proj_size P, w_hr of shape (P, H)) has h_t = w_hr (o * tanh(c_t)):
# h and each direction's output are P wide, c stays H wide, and w_hh is (4H, P).
RNN_MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
_RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


def _rnn_step_ref(mode, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr=None):
    """One step in float64: (h', c', saved) where saved holds what the backward needs."""
    H = w_hh.shape[0] // _RNN_GATES[mode]
    gx = x @ w_ih.T + (0.0 if b_ih is None else b_ih)  # (B, G*H)
    gh = h @ w_hh.T + (0.0 if b_hh is None else b_hh)  # (B, G*H)
    if mode == "lstm":
        a = gx + gh
        i, f = _sigmoid64(a[:, :H]), _sigmoid64(a[:, H:2 * H])
        g, o = np.tanh(a[:, 2 * H:3 * H]), _sigmoid64(a[:, 3 * H:])
        c2 = f * c + i * g
        m = o * np.tanh(c2)
        return (m if w_hr is None else m @ w_hr.T), c2, (i, f, g, o, c2, m)
    if mode == "gru":
        r = _sigmoid64(gx[:, :H] + gh[:, :H])
        z = _sigmoid64(gx[:, H:2 * H] + gh[:, H:2 * H])
        hn = gh[:, 2 * H:]
        n = np.tanh(gx[:, 2 * H:] + r * hn)
        return (1.0 - z) * n + z * h, None, (r, z, n, hn)
    a = gx + gh
    h2 = np.tanh(a) if mode == "rnn_tanh" else np.maximum(a, 0.0)
    return h2, None, (h2,)


def lstm_cell_ref(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    """(h', c') of torch.nn.LSTMCell in float64; x (B, I), h and c (B, H)."""
    h2, c2, _ = _rnn_step_ref("lstm", _f64(x), _f64(h), _f64(c), _f64(w_ih), _f64(w_hh),
                              None if b_ih is None else _f64(b_ih), None if b_hh is None else _f64(b_hh))
    return h2, c2


def gru_cell_ref(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """h' of torch.nn.GRUCell in float64."""
    return _rnn_step_ref("gru", _f64(x), _f64(h), None, _f64(w_ih), _f64(w_hh),
                         None if b_ih is None else _f64(b_ih), None if b_hh is None else _f64(b_hh))[0]


def rnn_cell_ref(x, h, w_ih, w_hh, b_ih=None, b_hh=None, nonlinearity="tanh"):
    """h' of torch.nn.RNNCell in float64."""
    return _rnn_step_ref("rnn_" + nonlinearity, _f64(x), _f64(h), None, _f64(w_ih), _f64(w_hh),
                         None if b_ih is None else _f64(b_ih), None if b_hh is None else _f64(b_hh))[0]


def _rnn_weights_ref(weights, num_layers, dirs):
    """[(w_ih, w_hh, b_ih, b_hh, w_hr)] per layer-direction from the flat list, in float64: 2 or 4 entries
    a layer-direction (without or with biases), 3 or 5 with an LSTM projection (w_hr last)."""
    n = num_layers * dirs
    per = len(weights) // n
    if per not in (2, 3, 4, 5) or per * n != len(weights):
        raise ValueError(f"rnn reference: {len(weights)} weights for {num_layers} layers x {dirs} directions")
    out = []
    for k in range(n):
        w = [_f64(v) for v in weights[k * per:(k + 1) * per]]
        w_hr = w.pop() if per in (3, 5) else None
        out.append((w[0], w[1], w[2], w[3], w_hr) if len(w) == 4 else (w[0], w[1], None, None, w_hr))
    return out


def rnn_sequence_ref(mode, x, h0, c0, weights, num_layers=1, bidirectional=False, dropout_masks=None):
    """(output (T, B, D*S), h_n (L*D, B, S), c_n (L*D, B, H) or None) of torch.nn.LSTM/GRU/RNN in float64,
    S = H, or P with a projection.

    mode: 'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'; x (T, B, I); h0 (L*D, B, S), c0 (L*D, B, H) or None
    (zeros). dropout_masks: None, or num_layers - 1 arrays (T, B, D*S) multiplied into the output of
    every layer but the last before the next layer reads it (dropout's scaled keep masks)."""
    D = 2 if bidirectional else 1
    params = _rnn_weights_ref(weights, num_layers, D)
    layer_in = _f64(x)
    T, B = layer_in.shape[:2]
    S = params[0][1].shape[1]
    H = params[0][1].shape[0] // _RNN_GATES[mode]
    h0 = np.zeros((num_layers * D, B, S)) if h0 is None else _f64(h0)
    c0 = np.zeros((num_layers * D, B, H)) if c0 is None else _f64(c0)
    h_n, c_n = np.zeros_like(h0), np.zeros_like(c0)
    for layer in range(num_layers):
        out = np.zeros((T, B, D * S))
        for d in range(D):
            k = layer * D + d
            h, c = h0[k], c0[k]
            for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                h, c2, _ = _rnn_step_ref(mode, layer_in[t], h, c, *params[k])
                c = c if c2 is None else c2
                out[t, :, d * S:(d + 1) * S] = h
            h_n[k], c_n[k] = h, c
        layer_in = out if dropout_masks is None or layer == num_layers - 1 else out * _f64(dropout_masks[layer])
    return layer_in, h_n, (c_n if mode == "lstm" else None)


def rnn_sequence_backward_ref(mode, x, h0, c0, weights, grad_output, grad_h_n=None, grad_c_n=None, num_layers=1,
                              bidirectional=False, dropout_masks=None):
    """Backward through time of rnn_sequence_ref in float64, for L = sum(grad_output * output) +
    sum(grad_h_n * h_n) + sum(grad_c_n * c_n). Returns (grad_x, grad_h0, grad_c0 or None, grad_weights)
    with grad_weights a list in the order of `weights`. dropout_masks as for rnn_sequence_ref."""
    D = 2 if bidirectional else 1
    params = _rnn_weights_ref(weights, num_layers, D)
    has_bias = params[0][2] is not None
    x = _f64(x)
    T, B = x.shape[:2]
    G = _RNN_GATES[mode]
    S = params[0][1].shape[1]
    H = params[0][1].shape[0] // G
    h0 = np.zeros((num_layers * D, B, S)) if h0 is None else _f64(h0)
    c0 = np.zeros((num_layers * D, B, H)) if c0 is None else _f64(c0)
    # Forward, keeping every step's input, states and saved values.
    inputs, tapes = [], []
    layer_in = x
    for layer in range(num_layers):
        inputs.append(layer_in)
        out = np.zeros((T, B, D * S))
        for d in range(D):
            k = layer * D + d
            h, c = h0[k], c0[k]
            tape = {}
            for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                h2, c2, saved = _rnn_step_ref(mode, layer_in[t], h, c, *params[k])
                tape[t] = (h, c, saved)  # state before the step, and the step's saved values
                h, c = h2, (c if c2 is None else c2)
                out[t, :, d * S:(d + 1) * S] = h
            tapes.append(tape)
        layer_in = out if dropout_masks is None or layer == num_layers - 1 else out * _f64(dropout_masks[layer])
    grad_out = _f64(grad_output)
    gh_n = np.zeros_like(h0) if grad_h_n is None else _f64(grad_h_n)
    gc_n = np.zeros_like(c0) if grad_c_n is None else _f64(grad_c_n)
    grad_h0, grad_c0 = np.zeros_like(h0), np.zeros_like(c0)
    grads = [None] * (num_layers * D)
    for layer in reversed(range(num_layers)):
        lin = inputs[layer]
        grad_in = np.zeros_like(lin)
        for d in range(D):
            k = layer * D + d
            w_ih, w_hh, w_hr = params[k][0], params[k][1], params[k][4]
            dw_ih, dw_hh = np.zeros_like(w_ih), np.zeros_like(w_hh)
            dw_hr = None if w_hr is None else np.zeros_like(w_hr)
            db_ih, db_hh = np.zeros(G * H), np.zeros(G * H)
            dh, dc = gh_n[k].copy(), gc_n[k].copy()
            for t in (range(T - 1, -1, -1) if d == 0 else range(T)):
                h_prev, c_prev, saved = tapes[k][t]
                dh = dh + grad_out[t, :, d * S:(d + 1) * S]
                if mode == "lstm":
                    i, f, g, o, c_t, m = saved
                    if w_hr is not None:  # h_t = m_t w_hr^T: the cell's output m_t receives dh w_hr
                        dw_hr += dh.T @ m
                        dh = dh @ w_hr
                    tc = np.tanh(c_t)
                    dct = dc + dh * o * (1.0 - tc ** 2)
                    da = np.concatenate([dct * g * i * (1 - i), dct * c_prev * f * (1 - f), dct * i * (1 - g ** 2),
                                         dh * tc * o * (1 - o)], axis=1)
                    dax = dah = da
                    dc = dct * f
                    dh_direct = 0.0
                elif mode == "gru":
                    r, z, n, hn = saved
                    dan = dh * (1 - z) * (1 - n ** 2)
                    dar = dan * hn * r * (1 - r)
                    daz = dh * (h_prev - n) * z * (1 - z)
                    dax = np.concatenate([dar, daz, dan], axis=1)
                    dah = np.concatenate([dar, daz, dan * r], axis=1)
                    dh_direct = dh * z
                else:
                    (h_t,) = saved
                    # ReLU's gradient selects (as torch's threshold_backward): a NaN or Inf of dh where the unit
                    # is off gives 0, not NaN.
                    dax = dah = dh * (1 - h_t ** 2) if mode == "rnn_tanh" else np.where(h_t > 0, dh, 0.0)
                    dh_direct = 0.0
                dw_ih += dax.T @ lin[t]
                dw_hh += dah.T @ h_prev
                db_ih += dax.sum(0)
                db_hh += dah.sum(0)
                grad_in[t] += dax @ w_ih
                dh = dah @ w_hh + dh_direct
            grad_h0[k], grad_c0[k] = dh, dc
            grads[k] = [dw_ih, dw_hh] + ([db_ih, db_hh] if has_bias else []) + ([] if w_hr is None else [dw_hr])
        grad_out = grad_in if dropout_masks is None or layer == 0 else grad_in * _f64(dropout_masks[layer - 1])
    flat = [g for per in grads for g in per]
    return grad_out, grad_h0, (grad_c0 if mode == "lstm" else None), flat
