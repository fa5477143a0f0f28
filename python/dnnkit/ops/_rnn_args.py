"""The RNN operators' argument checks that do not depend on where the arrays are (recurrent.py for the
host, gpu_recurrent.py for the GPU): layer counts, dropout, projections, the RNN's nonlinearity, an
LSTM cell's states, and the weights' structure (list or dict, torch.nn.LSTM's parameter names and order,
and the kernels' flat order). Errors name the operator and the argument."""
from __future__ import annotations

import numpy as np

from ..problem import shown


def _param_names(num_layers: int, dirs: int, bias: bool, proj: bool = False) -> list:
    names = []
    for layer in range(num_layers):
        for suffix in ("", "_reverse")[:dirs]:
            names += [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}"]
            if bias:
                names += [f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
            if proj:
                names.append(f"weight_hr_l{layer}{suffix}")
    return names

def _layers(op: str, num_layers) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)):
        raise TypeError(f"{op}: num_layers must be an int, got {type(num_layers).__name__}")
    if num_layers < 1:
        raise ValueError(f"{op}: num_layers must be >= 1, got {num_layers}")
    return int(num_layers)

def _weights(op: str, weights, num_layers: int, dirs: int, proj: bool = False):
    """(list of arrays in module order, names, as_dict, has_bias) from a list/tuple or a dict."""
    n = num_layers * dirs
    config = f"num_layers={num_layers}, bidirectional={dirs == 2}" + (", proj_size > 0" if proj else "")
    extra_w = 1 if proj else 0  # weight_hr per layer-direction
    if isinstance(weights, dict):
        has_bias = "bias_ih_l0" in weights or "bias_hh_l0" in weights
        names = _param_names(num_layers, dirs, has_bias, proj)
        missing = [k for k in names if k not in weights]
        extra = [k for k in weights if k not in names]
        if missing or extra:
            raise ValueError(f"{op}: weights for {config} (biases {'present' if has_bias else 'absent'}) must have "
                             f"the keys {names}; missing {missing}, unexpected {extra}")
        return [weights[k] for k in names], names, True, has_bias
    if not isinstance(weights, (list, tuple)):
        raise TypeError(f"{op}: weights must be a list or a dict of arrays, got {type(weights).__name__}")
    if len(weights) not in ((4 + extra_w) * n, (2 + extra_w) * n):
        raise ValueError(f"{op}: weights has {len(weights)} entries but {config} needs {(4 + extra_w) * n} "
                         f"(or {(2 + extra_w) * n} without biases)")
    has_bias = len(weights) == (4 + extra_w) * n
    return list(weights), _param_names(num_layers, dirs, has_bias, proj), False, has_bias

def _weight_label(names, as_dict, index) -> str:
    return f"weights[{names[index]!r}]" if as_dict else f"weights[{index}] ({names[index]})"

def _shape_error(op, label, got, want, first_layer) -> ValueError:
    """A weight of the wrong shape; a first layer's W_ih that fits but for its width is the input's fault."""
    if first_layer and len(got) == 2 and len(want) == 2 and got[0] == want[0]:
        return ValueError(f"{op}: input has {want[1]} features but {label} of shape {got} takes {got[1]}")
    return ValueError(f"{op}: {label} must have shape {want}, got {got}")


def _dropout(op, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: dropout must be a number in [0, 1], got {type(p).__name__}")
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{op}: dropout must be a probability in [0, 1], got {p}")
    return float(p)

def _proj_size(op, mode, proj_size) -> int:
    if isinstance(proj_size, bool) or not isinstance(proj_size, (int, np.integer)):
        raise TypeError(f"{op}: proj_size must be an int, got {type(proj_size).__name__}")
    if proj_size < 0:
        raise ValueError(f"{op}: proj_size must be >= 0, got {proj_size}")
    if proj_size and mode != "lstm":
        raise ValueError(f"{op}: proj_size is only for LSTMs")
    return int(proj_size)


def _generator(op, generator) -> np.random.Generator:
    if isinstance(generator, np.random.Generator):
        return generator
    if generator is None or (isinstance(generator, (int, np.integer)) and not isinstance(generator, bool)):
        if generator is not None and generator < 0:
            raise ValueError(f"{op}: generator as a seed must be >= 0, got {generator}")
        return np.random.default_rng(generator)
    raise TypeError(f"{op}: generator must be None, an int seed or a numpy.random.Generator, "
                    f"got {type(generator).__name__}")


def _flat(arrays, groups, has_bias, proj):
    """The kernel's flat list from the weights in module order: per layer-direction w_ih, w_hh, b_ih, b_hh
    (None, None without biases), then w_hr with a projection."""
    per, flat = (4 if has_bias else 2) + (1 if proj else 0), []
    for k in range(groups):
        group = arrays[k * per:(k + 1) * per]
        flat += group[:2] + (group[2:4] if has_bias else [None, None]) + ([group[-1]] if proj else [])
    return flat


def _rnn_mode(nonlinearity) -> str:
    if not isinstance(nonlinearity, str) or nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"rnn: nonlinearity must be 'tanh' or 'relu', got {shown(nonlinearity)}")
    return "rnn_" + nonlinearity


def _lstm_hx(hx):
    """lstm_cell's hx as (h, c)."""
    if hx is None:
        return None, None
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise TypeError(f"lstm_cell: hx must be a pair (h, c) or None, got {type(hx).__name__}")
    if (hx[0] is None) != (hx[1] is None):
        raise TypeError(f"lstm_cell: hx must hold both h and c (or be None for zeros), got hx[{int(hx[1] is None)}] "
                        f"None")
    return hx
