"""Operands, outputs, calls and reference results for timing an algorithm on a problem, per operator.

For every tunable operator a Harness knows how to make random inputs of a problem's shapes (never zeros:
uniform in [-1, 1) or, for recurrent weights, in +-1/sqrt(hidden) as torch initialises them, so that a
kernel that skips work on zeros is not flattered and the gates do not saturate), how to allocate the
output, how to call an Algorithm's run() the way the public API does, which part of the output is
checked, and the float64 NumPy reference (reference.py: no dnnkit kernel in it). The autotuner
(tuner.py) is the only user; adding an operator to the tuner is one Harness and one entry in _HARNESSES.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from .. import reference as ref
from ..backends import cpu as _cpu
from ..problem import RNN_MODES, ConvProblem, GemmProblem, RnnProblem


@dataclasses.dataclass
class Operands:
    """The inputs of one call (in run()'s order) and its keyword inputs."""

    args: tuple
    kwargs: dict

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(a) for a in list(self.args) + list(self.kwargs.values()))


def _nbytes(a) -> int:
    if isinstance(a, np.ndarray):
        return a.nbytes
    if isinstance(a, (list, tuple)):
        return sum(_nbytes(e) for e in a)
    return int(getattr(a, "nbytes", 0))  # a packed weight


def _uniform(rng, shape, dtype, scale: float = 1.0) -> np.ndarray:
    return (rng.uniform(-scale, scale, size=shape)).astype(dtype)


class Harness:
    """How the tuner runs one operator family. Subclasses define each step."""

    def data_arg(self, p) -> int:
        """Which of run()'s inputs is the data (not a weight): where with_nonfinite plants its values."""
        return 0

    def with_nonfinite(self, p, ops: Operands) -> Operands:
        """ops with a NaN and a +Inf planted in the data input (a third of the way and two thirds in)."""
        args = list(ops.args)
        i = self.data_arg(p)
        a = args[i].copy()
        flat = a.reshape(-1)
        flat[flat.size // 3] = np.nan
        flat[2 * flat.size // 3] = np.inf
        args[i] = a
        return Operands(tuple(args), dict(ops.kwargs))

    def operands(self, p, rng) -> Operands:
        raise NotImplementedError

    def output(self, p, ops: Operands, fill=None):
        """A fresh output for a call on ops (filled with `fill` where given: NaN shows a skipped write)."""
        raise NotImplementedError

    def run(self, algorithm, p, ops: Operands, out, workspace_bytes: int):
        raise NotImplementedError

    def result(self, p, out) -> np.ndarray:
        """The part of out compared with the reference, as one array."""
        return out

    def reference(self, p, ops: Operands) -> np.ndarray:
        raise NotImplementedError

    def nbytes(self, p, ops: Operands) -> int:
        """Bytes of one call's operands and output: what the tuner compares with the last-level cache."""
        return ops.nbytes + _nbytes(self.output(p, ops))


class _ArrayOut(Harness):
    """An operator with one output array and a workspace the caller allocates (as ops/convolution.py does, from
    the same source, and counted in the time: it is part of what a call costs)."""

    def output_shape(self, p) -> tuple:
        raise NotImplementedError

    def output(self, p, ops, fill=None):
        shape = self.output_shape(p)
        return np.empty(shape, p.dtype) if fill is None else np.full(shape, fill, p.dtype)

    def nbytes(self, p, ops) -> int:
        return ops.nbytes + math.prod(self.output_shape(p)) * np.dtype(p.dtype).itemsize

    def run(self, algorithm, p, ops, out, workspace_bytes):
        kwargs = dict(ops.kwargs)
        if p.op != "gemm":
            kwargs["workspace"] = _cpu.workspace(workspace_bytes, p.itemsize)
        algorithm.run(p, *ops.args, out=out, **kwargs)
        return out


class GemmHarness(_ArrayOut):
    def operands(self, p: GemmProblem, rng) -> Operands:
        dt = np.dtype(p.dtype)
        a = _uniform(rng, (p.k, p.m) if p.trans_a else (p.m, p.k), dt)
        b = _uniform(rng, (p.n, p.k) if p.trans_b else (p.k, p.n), dt)
        kwargs = {"bias": _uniform(rng, (p.n,), dt)} if p.bias else {}
        if p.packed:  # the weight (n x k) packed once, as pack_weight does for a layer
            from ..packed import pack_weight

            return Operands((a, pack_weight(b)), kwargs)
        return Operands((a.T if p.trans_a else a, b.T if p.trans_b else b), kwargs)

    def output_shape(self, p):
        return (p.m, p.n)

    def reference(self, p, ops):
        a, b = ops.args
        b = b.weight.T if p.packed else b
        return ref.activation_ref(ref.gemm_ref(a, b) + (ref._f64(ops.kwargs["bias"]) if p.bias else 0.0),
                                  p.activation)


class ConvHarness(_ArrayOut):
    def data_arg(self, p) -> int:
        return 1 if p.direction == "bwd_data" else 0  # dy, else x

    def operands(self, p: ConvProblem, rng) -> Operands:
        dt = np.dtype(p.dtype)
        x_shape, w_shape, y_shape = p.input_shape, p.weight_shape, p.output_shape
        if p.direction == "fwd":
            kwargs = {"bias": _uniform(rng, (p.oc,), dt)} if p.bias else {}
            return Operands((_uniform(rng, x_shape, dt), _uniform(rng, w_shape, dt)), kwargs)
        if p.direction == "bwd_data":
            return Operands((_uniform(rng, w_shape, dt), _uniform(rng, y_shape, dt)), {})
        return Operands((_uniform(rng, x_shape, dt), _uniform(rng, y_shape, dt)), {})

    def output_shape(self, p):
        return {"fwd": p.output_shape, "bwd_data": p.input_shape}.get(p.direction, p.weight_shape)

    def reference(self, p, ops):
        geometry = dict(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.g)
        if p.direction == "fwd":
            x, w = ops.args
            return ref.conv2d_ref(x, w, ops.kwargs.get("bias"), **geometry)
        if p.direction == "bwd_data":
            w, dy = ops.args
            return ref.conv2d_backward_data_ref(p.input_shape, w, dy, **geometry)
        x, dy = ops.args
        return ref.conv2d_backward_filter_ref(x, p.weight_shape, dy, **geometry)


class RnnHarness(Harness):
    """A sequence's forward (inference: no reserve) or backward through time. The backward's operands
    include a training forward's outputs and reserve, made once by the kernel's default algorithm; every
    candidate reads them (the backward does not write them). Checked: forward, the last layer's output;
    backward, the input, initial-state and weight gradients as one vector."""

    def data_arg(self, p) -> int:
        return 0 if p.direction == "fwd" else 6  # x, else dy (x is what the saved forward ran on)

    def _shape(self, p: RnnProblem):
        from ..algos.rnn_cpu import shape_tuple

        return shape_tuple(p)

    def _forward_operands(self, p: RnnProblem, rng):
        dt = np.dtype(p.dtype)
        T, B, H, S, D, L = p.seq, p.batch, p.hidden, p.state, p.dirs, p.layers
        k = 1.0 / math.sqrt(H)
        x = _uniform(rng, (T, B, p.input), dt)
        h0 = _uniform(rng, (L * D, B, S), dt)
        c0 = _uniform(rng, (L * D, B, H), dt) if p.mode == "lstm" else None
        flat = []
        for layer in range(L):
            il = p.input if layer == 0 else D * S
            for _ in range(D):
                flat += [_uniform(rng, (p.gates * H, il), dt, k), _uniform(rng, (p.gates * H, S), dt, k)]
                flat += ([_uniform(rng, (p.gates * H,), dt, k) for _ in range(2)] if p.bias else [None, None])
                flat += [_uniform(rng, (S, H), dt, k)] if p.proj else []
        return x, h0, c0, flat

    def operands(self, p: RnnProblem, rng) -> Operands:
        x, h0, c0, flat = self._forward_operands(p, rng)
        if p.direction == "fwd":
            return Operands((x, h0, c0, flat), {})
        from .. import algos
        from ..algos.rnn_cpu import reserve_elems

        fp = dataclasses.replace(p, direction="fwd")
        ys = self._layer_outputs(fp)
        reserve = np.empty(reserve_elems(self._shape(fp)), p.dtype)
        h_n = np.empty((p.layers * p.dirs, p.batch, p.state), p.dtype)
        c_n = np.empty((p.layers * p.dirs, p.batch, p.hidden), p.dtype) if p.mode == "lstm" else None
        algos.algorithms(fp.op, "cpu")[0].run(fp, x, h0, c0, flat, out=ys, h_n=h_n, c_n=c_n, reserve=reserve)
        dt = np.dtype(p.dtype)
        dy = _uniform(rng, ys[-1].shape, dt)
        dh_n = _uniform(rng, h_n.shape, dt)
        dc_n = None if c_n is None else _uniform(rng, c_n.shape, dt)
        return Operands((x, h0, c0, flat, ys, reserve, dy, dh_n, dc_n), {})

    @staticmethod
    def _layer_outputs(p, fill=None):
        shape = (p.seq, p.batch, p.dirs * p.state)
        return [np.empty(shape, p.dtype) if fill is None else np.full(shape, fill, p.dtype) for _ in range(p.layers)]

    def output(self, p, ops, fill=None):
        new = (lambda shape: np.empty(shape, p.dtype)) if fill is None else (
            lambda shape: np.full(shape, fill, p.dtype))
        states = (p.layers * p.dirs, p.batch)
        if p.direction == "fwd":
            return {"ys": self._layer_outputs(p, fill), "h_n": new(states + (p.state,)),
                    "c_n": new(states + (p.hidden,)) if p.mode == "lstm" else None}
        flat = ops.args[3]
        return (new((p.seq, p.batch, p.input)), new(states + (p.state,)),
                new(states + (p.hidden,)) if p.mode == "lstm" else None,
                [None if w is None else new(w.shape) for w in flat])

    def run(self, algorithm, p, ops, out, workspace_bytes):
        if p.direction == "fwd":
            algorithm.run(p, *ops.args, out=out["ys"], h_n=out["h_n"], c_n=out["c_n"], reserve=None)
        else:
            algorithm.run(p, *ops.args, out=out)
        return out

    def result(self, p, out):
        if p.direction == "fwd":
            return out["ys"][-1]
        dx, dh0, _, grads = out
        return np.concatenate([a.ravel() for a in [dx, dh0, *grads] if a is not None])

    def reference(self, p, ops):
        x, h0, c0, flat = ops.args[:4]
        weights = [w for w in flat if w is not None]
        if p.direction == "fwd":
            return ref.rnn_sequence_ref(p.mode, x, h0, c0, weights, p.layers, p.dirs == 2)[0]
        dy, dh_n, dc_n = ops.args[6:]
        gx, gh0, _, gw = ref.rnn_sequence_backward_ref(p.mode, x, h0, c0, weights, dy, dh_n, dc_n, p.layers,
                                                        p.dirs == 2)
        return np.concatenate([a.ravel() for a in [gx, gh0, *gw]])


@dataclasses.dataclass
class DeviceOperands(Operands):
    """Operands copied to the GPU, with the host arrays they were made from (the reference's inputs)."""

    host: Operands = None

    @property
    def nbytes(self) -> int:
        return self.host.nbytes


def _to_device(x):
    from numba import cuda

    if isinstance(x, np.ndarray):
        return cuda.to_device(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_device(e) for e in x)
    return x


class DeviceHarness(Harness):
    """A host Harness's operator on the GPU: the same random operands, copied to the device; outputs there;
    calls on the default stream; results copied back to the host for the checks."""

    def __init__(self, host: Harness):
        self.host = host

    def data_arg(self, p) -> int:
        return self.host.data_arg(p)

    def _upload(self, ops: Operands) -> DeviceOperands:
        return DeviceOperands(_to_device(tuple(ops.args)), {k: _to_device(v) for k, v in ops.kwargs.items()}, ops)

    def operands(self, p, rng) -> DeviceOperands:
        return self._upload(self.host.operands(p, rng))

    def with_nonfinite(self, p, ops) -> DeviceOperands:
        return self._upload(self.host.with_nonfinite(p, ops.host))

    def output(self, p, ops, fill=None):
        return _to_device(self.host.output(p, ops.host, fill=0.0 if fill is None else fill))

    def run(self, algorithm, p, ops, out, workspace_bytes):
        if p.op != "gemm":
            raise NotImplementedError(f"autotune: {p.op} has no GPU algorithm to time")
        algorithm.run(p, *ops.args, out=out, **ops.kwargs)
        return out

    def result(self, p, out):
        return self.host.result(p, out.copy_to_host())

    def reference(self, p, ops):
        return self.host.reference(p, ops.host)

    def nbytes(self, p, ops) -> int:
        return self.host.nbytes(p, ops.host)


@functools.lru_cache(maxsize=256)
def _ruled_plan(gp):
    """The plan of a GPU RNN's inner GEMM while the RNN is timed: the algorithm the rules take (TF32 aside),
    what an untuned dispatch gives, so that every candidate multiplies the same way."""
    from .. import algos
    from ..plans import Plan

    supported = [a for a in algos.algorithms(gp.op, "cuda") if not a.tf32 and a.supports(gp) is None]
    return Plan.of(gp, ([a for a in supported if a.rule(gp) is None] or supported)[0])


class DeviceRnnHarness(Harness):
    """The RNN sequences on the GPU: the host harness's random inputs, copied to the device; the forward's
    outputs (the last layer's, h_n, c_n) there; the backward's operands a training forward's layer
    outputs and saves, made once on the device by gpu_steps (every candidate reads them), and random
    incoming gradients. Checked as on the host: forward, the last layer's output; backward, every
    gradient as one vector, against the float64 reference."""

    def __init__(self, host: RnnHarness):
        self.host = host

    def data_arg(self, p) -> int:
        return 0

    def _host(self, p, rng):
        x, h0, c0, flat = self.host._forward_operands(p, rng)
        if p.direction == "fwd":
            return Operands((x, h0, c0, flat), {})
        dt = np.dtype(p.dtype)
        dy = _uniform(rng, (p.seq, p.batch, p.dirs * p.state), dt)
        dh_n = _uniform(rng, h0.shape, dt)
        dc_n = _uniform(rng, c0.shape, dt) if c0 is not None else None
        return Operands((x, h0, c0, flat, dy, dh_n, dc_n), {})

    def _upload(self, p, host: Operands) -> DeviceOperands:
        from ..algos.rnn_cuda import SAVED, GpuSteps

        args = _to_device(tuple(host.args))
        if p.direction == "fwd":
            return DeviceOperands(args, {}, host)
        x, h0, c0, flat = args[:4]
        from numba import cuda

        fp = dataclasses.replace(p, direction="fwd")
        shape = (p.seq, p.batch, p.dirs * p.state)
        ys = [cuda.device_array(shape, p.dtype) for _ in range(p.layers)]
        width = (SAVED[p.mode] + (1 if p.proj else 0)) * p.hidden
        saves = [cuda.device_array((p.seq, p.batch, width), p.dtype) if SAVED[p.mode] else None
                 for _ in range(p.layers * p.dirs)]
        h_n = cuda.device_array(h0.shape, p.dtype)
        c_n = cuda.device_array(c0.shape, p.dtype) if c0 is not None else None
        GpuSteps(p.mode).run(fp, x, h0, c0, list(flat), out=ys[-1], h_n=h_n, c_n=c_n, gemm_plan=_ruled_plan, ys=ys,
                             saves=saves)
        return DeviceOperands((x, h0, c0, list(flat), ys, saves) + args[4:], {}, host)

    def operands(self, p, rng) -> DeviceOperands:
        return self._upload(p, self._host(p, rng))

    def with_nonfinite(self, p, ops) -> DeviceOperands:
        args = list(ops.host.args)
        i = 0 if p.direction == "fwd" else 4  # x, else dy
        a = args[i].copy()
        flat = a.reshape(-1)
        flat[flat.size // 3] = np.nan
        flat[2 * flat.size // 3] = np.inf
        args[i] = a
        return self._upload(p, Operands(tuple(args), {}))

    def output(self, p, ops, fill=None):
        from numba import cuda

        fill = 0.0 if fill is None else fill
        new = (lambda shape: cuda.to_device(np.full(shape, fill, p.dtype)))
        states = (p.layers * p.dirs, p.batch)
        if p.direction == "fwd":
            return {"out": new((p.seq, p.batch, p.dirs * p.state)), "h_n": new(states + (p.state,)),
                    "c_n": new(states + (p.hidden,)) if p.mode == "lstm" else None}
        return {"dx": new((p.seq, p.batch, p.input)), "dh0": new(states + (p.state,)),
                "dc0": new(states + (p.hidden,)) if p.mode == "lstm" else None,
                "dweights": [None if w is None else new(w.shape) for w in ops.host.args[3]]}

    def run(self, algorithm, p, ops, out, workspace_bytes):
        if p.direction == "fwd":
            algorithm.run(p, *ops.args, out=out["out"], h_n=out["h_n"], c_n=out["c_n"], gemm_plan=_ruled_plan)
        else:
            algorithm.run(p, *ops.args, dx=out["dx"], dh0=out["dh0"], dc0=out["dc0"], dweights=out["dweights"],
                          gemm_plan=_ruled_plan)
        return out

    def result(self, p, out):
        if p.direction == "fwd":
            return out["out"].copy_to_host()
        arrays = [out["dx"], out["dh0"], *out["dweights"]]
        return np.concatenate([a.copy_to_host().ravel() for a in arrays if a is not None])

    def reference(self, p, ops):
        x, h0, c0, flat = ops.host.args[:4]
        weights = [w for w in flat if w is not None]
        if p.direction == "fwd":
            return ref.rnn_sequence_ref(p.mode, x, h0, c0, weights, p.layers, p.dirs == 2)[0]
        dy, dh_n, dc_n = ops.host.args[4:]
        gx, gh0, _, gw = ref.rnn_sequence_backward_ref(p.mode, x, h0, c0, weights, dy, dh_n, dc_n, p.layers,
                                                        p.dirs == 2)
        return np.concatenate([a.ravel() for a in [gx, gh0, *gw]])

    def nbytes(self, p, ops) -> int:
        """The inputs' bytes and the outputs': the last layer's output (forward) or the input's and the
        weights' gradients (backward), and the states'."""
        states = p.layers * p.dirs * p.batch * (p.state + p.hidden)
        if p.direction == "fwd":
            out = p.seq * p.batch * p.dirs * p.state + states
        else:
            out = p.seq * p.batch * p.input + states + sum(int(np.prod(w.shape)) for w in ops.host.args[3]
                                                           if w is not None)
        return ops.host.nbytes + out * np.dtype(p.dtype).itemsize


_GEMM, _CONV, _RNN = GemmHarness(), ConvHarness(), RnnHarness()
_HARNESSES = {"gemm": _GEMM, "conv2d_fwd": _CONV, "conv2d_bwd_data": _CONV, "conv2d_bwd_filter": _CONV}
_HARNESSES.update({f"{mode}_{d}": _RNN for mode in RNN_MODES for d in ("fwd", "bwd")})


def same_nonfinite(actual: np.ndarray, expected: np.ndarray) -> bool:
    """Whether actual has NaN, +Inf and -Inf exactly where expected has them."""
    return all(np.array_equal(f(actual), f(expected)) for f in (np.isnan, np.isposinf, np.isneginf))


def harness(p) -> Harness:
    """The Harness of p's operator; ValueError naming the tunable ones where it has none."""
    h = _HARNESSES.get(p.op)
    if h is None:
        raise ValueError(f"autotune: operator {p.op!r} is not tunable; tunable ones: {sorted(_HARNESSES)}")
    if getattr(p, "device", "cpu") == "cuda":
        return _DEVICE.setdefault(p.op, DeviceRnnHarness(h) if isinstance(h, RnnHarness) else DeviceHarness(h))
    return h


_DEVICE: dict[str, DeviceHarness] = {}


def operands(p, rng: np.random.Generator) -> Operands:
    """Random inputs for p. MemoryError when they do not fit."""
    return harness(p).operands(p, rng)
