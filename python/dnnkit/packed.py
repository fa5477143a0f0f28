"""Weights packed once for the CPU kernels: dnnkit.pack_weight.

A product by a weight W (out_features x in_features) runs its micro-kernel on W^T cut into panels of NR
columns, each stored k-major; the kernels pack W that way at every call, or read it in place more
slowly. A model that calls a layer or an RNN cell again and again on the same weights (inference, or a
cell stepped in a Python loop) can pack each weight once: ``pw = dnnkit.pack_weight(w)`` and pass ``pw``
where ``w`` went (``linear`` and the cells). The packing is a copy: after changing ``w`` in place, call
``pw.repack()``, or the kernels go on multiplying by the old values.
"""
from __future__ import annotations

import numpy as np

from ._checks import _array
from .algos.gemm_cpu import PackedWeightKernel
from .backends import DeviceArray, device_of, placement_error

def _weight(op, weight):

    try:
        return _array(op, "weight", weight, ndim=2)
    except DeviceArray:
        raise placement_error(op, weight=weight) from None


class PackedWeight(PackedWeightKernel):
    """A weight (out_features, in_features) packed for the active ISA's micro-kernel (and, float32 where AMX
    tiles are on, a second time as tile panels of three bfloat16 parts, which cells of 24 rows or more
    multiply on). ``weight`` is the
    array it was packed from (the backward passes read it); ``shape`` and ``dtype`` are that array's;
    ``nbytes`` the packing's size. Use it from many threads at once; ``repack`` may run beside them (a
    product already running finishes on the old packing)."""

    def __init__(self, weight):
        weight = _weight("pack_weight", weight)
        super().__init__(weight)
        self.weight = weight
        self.shape = weight.shape
        self.dtype = weight.dtype

    def repack(self, weight=None):
        """Packs `weight` (default: the array this was packed from, after an in-place update) in place of
        the current packing; the shape and dtype must stay."""
        weight = self.weight if weight is None else _weight("pack_weight", weight)
        if weight.shape != self.shape or weight.dtype != self.dtype:
            raise ValueError(f"pack_weight: repack needs a weight of shape {self.shape} and dtype {self.dtype}, "
                             f"got {weight.shape} {weight.dtype}")
        super().repack(weight)
        self.weight = weight
        return self

    def __reduce__(self):
        # The packed layout belongs to the ISA of the machine that packed it: pickle (and copy) the
        # weight, and pack again on load.
        return PackedWeight, (self.weight,)

    def __repr__(self):
        return f"PackedWeight(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes})"


class GpuPackedWeight:
    """pack_weight of a GPU array: a C-contiguous copy of it on its device, in its library (CuPy, PyTorch
    or Numba), taken on the caller's current stream. The GPU GEMMs read a weight of either layout with
    coalesced loads, so there is no panel format to gain there: this keeps the host's contract (a copy,
    ``repack`` after changing ``weight`` in place; ``linear`` and the cells take it where the weight
    went), so that code written with pack_weight runs on either device. ``packed`` is the copy, which
    the GPU kernels read (the cells' backward too: the weights their forward multiplied by)."""

    def __init__(self, weight):
        self.weight = None
        self.repack(weight)

    def repack(self, weight=None):
        """Copies `weight` (default: the array this was packed from, after an in-place update) in place of
        the current copy; the shape and dtype must stay."""
        from .backends import cuda as _cuda

        op = "pack_weight"
        new = self.weight if weight is None else weight
        d = _cuda.adopt(op, "weight", new, ndim=2)  # first: says why where the GPU backend is unavailable
        from .kernels import _jit, rnn

        shape, dtype = tuple(d.shape), _cuda.dtype_name(d)
        if self.weight is not None and (shape != self.shape or np.dtype(dtype) != self.dtype):
            raise ValueError(f"pack_weight: repack needs a weight of shape {self.shape} and dtype {self.dtype}, "
                             f"got {shape} {dtype}")
        stream = _cuda.stream_for(op, None, new)
        if self.weight is None:
            self.packed, self._device = _cuda.empty(op, new, shape, dtype, stream)
        rows, cols = shape
        _cuda.launch(rnn.copy(dtype), (_jit.cdiv(cols, rnn.STEP_X), _jit.cdiv(rows, rnn.STEP_Y)),
                     (rnn.STEP_X, rnn.STEP_Y), stream, d, self._device, rows, cols)
        self.weight, self.shape, self.dtype = new, shape, np.dtype(dtype)
        return self

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __reduce__(self):
        return GpuPackedWeight, (self.weight,)

    def __repr__(self):
        return f"GpuPackedWeight(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes})"


def pack_weight(weight):
    """Packs a weight (out_features, in_features), float32 or float64, any strides, once, for
    ``linear(x, packed, ...)`` and the cells (``lstm_cell(x, hx, packed_ih, packed_hh, ...)``). A GPU
    array gives a GpuPackedWeight (a contiguous copy on its device, for the same calls on GPU arrays)."""
    if device_of(weight) == "cuda":
        return GpuPackedWeight(weight)
    return PackedWeight(weight)


def unpacked(w):
    """The array behind a PackedWeight, or w itself."""
    return w.weight if isinstance(w, PackedWeight) else w
