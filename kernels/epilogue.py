"""Element-wise functions the kernels fuse into their stores: activations by code (the CPU kernels'
codes: 0 identity, 1 relu, 2 tanh, 3 sigmoid, 4 gelu, the exact erf form), one set per dtype so that
float32 kernels never compute in float64. NaN propagates through each."""
from __future__ import annotations

import functools

from ._jit import DTYPES, device, math

ACTIVATIONS = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "gelu": 4}


@functools.lru_cache(maxsize=None)
def activation(dtype: str):
    """act(v, code) for dtype."""
    t = DTYPES[dtype]
    zero, half, one, rsqrt2 = t(0.0), t(0.5), t(1.0), t(0.7071067811865476)

    @device
    def act(v, code):
        if code == 0:
            return v
        if code == 1:
            return zero if v < zero else v
        if code == 2:
            return math.tanh(v)
        if code == 3:
            return one / (one + math.exp(-v))
        return half * v * (one + math.erf(v * rsqrt2))

    return act


@functools.lru_cache(maxsize=None)
def activation_grad(dtype: str):
    """g * act'(z) from v: z (v_is_z) or the output y (relu, tanh and sigmoid only; gelu needs z). Relu's
    derivative at 0 is 0; a NaN in v propagates."""
    t = DTYPES[dtype]
    zero, half, one, rsqrt2, rsqrt2pi = t(0.0), t(0.5), t(1.0), t(0.7071067811865476), t(0.3989422804014327)

    @device
    def grad(g, v, code, v_is_z):
        if code == 0:
            return g
        if code == 1:
            return g * (one if v > zero else (v if v != v else zero))
        if code == 2:
            y = math.tanh(v) if v_is_z else v
            return g * (one - y * y)
        if code == 3:
            y = one / (one + math.exp(-v)) if v_is_z else v
            return g * y * (one - y)
        return g * (half * (one + math.erf(v * rsqrt2)) + v * rsqrt2pi * math.exp(-half * v * v))

    return grad
