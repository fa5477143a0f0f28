"""CPU convolution algorithms (csrc/conv), forward and both backward passes.

im2col_gemm (fwd, bwd_filter) / gemm_col2im (bwd_data): lower to dnnkit's blocked GEMM through a column
    buffer of (C/G*R*S) x chunk elements, chunk output pixels at a time so the workspace stays under a
    bound; 1x1 stride-1 unpadded convolutions use the input directly, with no workspace. The forward
    pass puts several images side by side in one GEMM when an image's output plane is small.
implicit_gemm (fwd): the im2col product with no column buffer: the GEMM packs each of its B panels
    straight from the input image (csrc/conv/implicit.cpp), so the columns are built in cache as they
    are consumed. One (image, group) product per thread when there are enough of them, else all threads
    on one product. Workspace: the filters packed once as the GEMM's A (not again for every image) and,
    when the layer pads, one zero-padded copy of an image-group's input planes per thread (the packing
    then needs no bounds checks); every shape.
winograd_f2x2_3x3 / winograd_f4x4_3x3 (fwd): F(m x m, 3 x 3) for 3x3 stride-1 dense filters, in one
    parallel region: the filters transformed once per call into the GEMM micro-kernel's packed layout,
    then chunks of 64 tiles, each transformed, multiplied (alpha^2 products on the micro-kernel) and
    transformed back by one thread in its own cache-sized buffers; at most 32 tiles, a transposed
    schedule that keeps the transformed input resident instead. Workspace: the packed filters and one
    chunk's buffers per thread. F(4x4) is less accurate (tolerance 1e-4 in float32). Backward data (3x3,
    stride 1, padding at most 2) is the same forward pass on dy with the filters transposed per group
    and turned by 180 degrees (the filter transforms read them so), at padding 2 - p. Backward filter
    (3x3, stride 1) is the transposed algorithm F(3x3, m x m): per transform point a GEMM over chunks
    of tiles, accumulated in an alpha^2 x K x C/g workspace, then G^T M G per filter.
fft (fwd): real 2-D FFTs of the padded input and of the dilated, zero-padded filter (scipy.fft,
    multithreaded), the per-frequency channel reduction in dnnkit's kernel, one inverse FFT per output
    channel; images in chunks so memory stays bounded. Meant for large filters; a stride above 1 is
    computed at stride 1 and subsampled.
direct: no workspace; every shape. Forward: a block of output channels by output columns of one row
    held in registers over the whole reduction (4 x 24 with AVX2's 16 vector registers, 8 x 32 with
    AVX-512's 32), reading zero-padded copies of the input rows the output row needs, each split into
    stride phases so that every tap reads contiguous inputs. Backward filter
    at unit stride along the row: a filter's taps summed at once (up to 9 accumulators) over a
    zero-padded input plane; other strides and backward data: loops with the padding bounds hoisted and
    the inner loop along an output row.
depthwise (fwd): one input channel per group (depthwise and channel-multiplier convolutions): each
    input plane copied once, zero-padded, into a per-thread workspace plane, then several output rows
    by a block of columns (up to 64 bytes) at a time in registers; memory-bound, one pass over input and
    output.
"""
from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np

import math

from ..backends.cpu import ext as _cpu
from .._config import get_num_threads, get_workspace_limit
from .base import Algorithm, cpu_float_reason
from .gemm_cpu import AMX_SPEEDUP, FULL_WIDTH_COLUMNS, depth_efficiency, gemm_efficiency, gemm_mc, micro_rows

# Bound on the im2col column buffer when the user sets no tighter workspace limit.
DEFAULT_COL_BYTES = 64 << 20

# The cost formulas' constants, fitted to ResNet-50's layers at batch 1, 2 and 8 in all three directions on
# two machines (bench/autotune.py; docs/algorithms.md, "The cost model"). Winograd's transforms in the time
# of this many float32 FLOPs at the peak (they are vector arithmetic on the same units, so they scale with
# the peak and the ISA's width as the products do):
TRANSFORM_FLOPS = 64.0    # one input or output transform element
FILTER_FLOPS = 128.0      # one element of U, transformed, stored and read back
FILTER_FEW_FLOPS = 24.0   # the same in the few-tiles schedule (U^T built in L2, never stored)
WINOGRAD_GEMM_EFFICIENCY = 0.8  # the transform-domain products on the micro-kernel, operands in L2
WINOGRAD_FEW_TILES = 32         # csrc/conv/winograd.cpp: at most this many tiles, the transposed schedule
WINOGRAD_BWD_DEPTH = 256        # csrc/conv/winograd.cpp kBwdDepth: tiles per chunk of the backward filter


def _dims(p):
    """(n, c, k, g, c/g, k/g, output pixels, direct-convolution FLOPs) of a convolution."""
    n, c, k, g = p.mb, p.ic, p.oc, p.g
    pq = p.oh * p.ow
    return n, c, k, g, c // g, k // g, pq, 2.0 * n * k * pq * (c // g) * p.kh * p.kw


def _tiles(p, m: int, n: int, k: int) -> float:
    """The blocked GEMM's speed-up on an m x n x k product of p's dtype: AMX_SPEEDUP where the tiles take a
    float32 product of this shape, else 1."""
    return AMX_SPEEDUP if p.dtype == "float32" and _cpu.amx_takes_shape(m, n, k) else 1.0


def workspace_bound() -> int:
    """Bytes an algorithm may use for its chunked buffers: the user's limit, at most DEFAULT_COL_BYTES."""
    limit = get_workspace_limit()
    return DEFAULT_COL_BYTES if limit is None else min(limit, DEFAULT_COL_BYTES)


def shape_tuple(p) -> tuple:
    """The kernels' shape: (n, c, h, w, k, r, s, p, q, sh, sw, ph, pw, dh, dw, g), dilation 1-based."""
    return (p.mb, p.ic, p.ih, p.iw, p.oc, p.kh, p.kw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw, p.dh + 1, p.dw + 1, p.g)


class _CpuConv(Algorithm):
    """A convolution kernel of the extension's table (csrc/conv/kernels.h), named by direction and kernel;
    it states its own workspace. chunk(p) is the kernel's blocking parameter (see each)."""

    backend = "cpu"
    kernel = ""       # the C++ kernel's name in csrc/conv/kernels.h
    direction = ""    # "fwd", "bwd_data" or "bwd_filter"

    def supports(self, p) -> str | None:
        return cpu_float_reason(p)

    def chunk(self, p) -> int:
        return 1

    def workspace_bytes(self, p) -> int:
        elems = _cpu.conv_workspace_elems(self.direction, self.kernel, shape_tuple(p), self.chunk(p), p.itemsize)
        return int(elems) * p.itemsize

    def run(self, p, a0, a1, *, out, bias=None, workspace=None):
        """fwd: (x, w) -> out = y; bwd_data: (w, dy) -> out = dx; bwd_filter: (x, dy) -> out = dw.
        All arrays C-contiguous of p.dtype; workspace a 1-D array of workspace_bytes(p) bytes or None."""
        _cpu.conv2d(self.direction, self.kernel, shape_tuple(p), a0, a1, bias, out, workspace, self.chunk(p))
        return out


class _Im2col(_CpuConv):
    tolerance = 1e-5
    batching = "none"  # where small images go side by side in one GEMM: "columns" or "depth" (conv.h)

    def batch(self, p) -> str:
        return self.batching

    def chunk(self, p) -> int:
        bound = workspace_bound()
        return int(_cpu.im2col_chunk(shape_tuple(p), bound // p.itemsize, self.batch(p)))


class _Direct(_CpuConv):
    tolerance = 1e-5
    kernel = "direct"


class Im2colGemmFwd(_Im2col):
    name, op, kernel, direction = "im2col_gemm", "conv2d_fwd", "im2col_gemm", "fwd"
    batching = "columns"

    def cost(self, p, c) -> float:
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        pointwise = (p.kh, p.kw, p.sh, p.sw, p.ph, p.pw) == (1, 1, 1, 1, 0, 0)
        # Small planes go side by side in one GEMM, which runs about as fast as one image's would (the
        # threads then split its rows, not its columns) but on the AMX tiles where they take its shape.
        crs, chunk = cg * p.kh * p.kw, self.chunk(p)
        images = min(n, _side_by_side(p, chunk))
        cols = pq * images if images > 1 else min(pq, chunk)
        t = direct / (c.peak(p) * gemm_efficiency(kg, pq, crs) * _tiles(p, kg, cols, crs))
        # The GEMM packs its B operand (the columns, or the input planes of a 1x1 layer) once per block
        # of MC output channels, and building the columns is one more copy.
        copy = 2 * n * ch * p.kh * p.kw * pq * p.itemsize / c.bandwidth
        t += copy * (math.ceil(kg / gemm_mc(p.itemsize)) + (0 if pointwise else 1))
        if pq < 512 and n > 1:  # images side by side: the GEMM's output is copied back to NCHW
            t += 2 * n * k * pq * p.itemsize / c.bandwidth
        return t


def _gemm_backward_cost(p, c, whole_images: bool = False, images: int = 1) -> float:
    """Backward data (W^T dy into columns, then col2im) or filter (dy times the columns) as one GEMM and a
    pass over the columns; whole_images: each thread runs whole images' products, each at a full panel's
    width; images: that many side by side in each product (the data's along its columns, the filter's
    along its depth, dY gathered for them)."""
    n, ch, k, g, cg, kg, pq, direct = _dims(p)
    crs = cg * p.kh * p.kw
    m, cols, inner = (crs, pq * images, kg) if p.direction == "bwd_data" else (kg, crs, pq * images)
    if whole_images:
        cols = max(cols, FULL_WIDTH_COLUMNS)
    columns = 2 * n * ch * p.kh * p.kw * pq * p.itemsize / c.bandwidth
    if images > 1 and p.direction == "bwd_filter":
        columns += 2 * n * k * pq * p.itemsize / c.bandwidth
    return direct / (c.peak(p) * gemm_efficiency(m, cols, inner) * _tiles(p, m, cols, inner)) + columns


def _side_by_side(p, chunk: int) -> int:
    """Images side by side in one product for this chunk (csrc/conv/conv.h images_per_chunk)."""
    pq = p.oh * p.ow
    return max(1, chunk // pq) if pq else 1


class GemmCol2imBwdData(_Im2col):
    name, op, kernel, direction = "gemm_col2im", "conv2d_bwd_data", "gemm_col2im", "bwd_data"

    batching = "columns"  # small planes side by side in one GEMM, as in the forward pass

    def cost(self, p, c) -> float:
        return _gemm_backward_cost(p, c, images=_side_by_side(p, self.chunk(p)))


class Im2colGemmBwdFilter(_Im2col):
    name, op, kernel, direction = "im2col_gemm", "conv2d_bwd_filter", "im2col_gemm", "bwd_filter"

    @staticmethod
    def _threads(p) -> int:
        """csrc/conv/conv.h im2col_bwd_filter_threads: threads take whole images (each with a partial dW)
        when there are two and dW holds at most 64K values."""
        small = p.oc * (p.ic // p.g) * p.kh * p.kw <= 1 << 16
        return min(get_num_threads(), p.mb) if p.mb >= 2 and small else 1

    batching = "depth"  # where dW is shared (one thread's products): conv.h

    def chunk(self, p) -> int:
        nt = self._threads(p)
        if nt == 1:
            return super().chunk(p)
        bound = workspace_bound() // nt - p.oc * (p.ic // p.g) * p.kh * p.kw * p.itemsize
        return int(_cpu.im2col_chunk(shape_tuple(p), max(bound, 0) // p.itemsize, "none"))

    def cost(self, p, c) -> float:
        """_gemm_backward_cost; where threads take whole images, each runs its images' products alone, as
        wide as a full panel (no split of dW's few columns between the threads); small planes side by
        side as the extension's chunk says."""
        images = _side_by_side(p, self.chunk(p)) if self._threads(p) == 1 else 1
        return _gemm_backward_cost(p, c, whole_images=self._threads(p) > 1, images=images)


class ImplicitGemmFwd(_CpuConv):
    name = kernel = "implicit_gemm"
    op, direction = "conv2d_fwd", "fwd"
    tolerance = 1e-5

    def chunk(self, p) -> int:
        return get_num_threads()  # the workspace holds one padded image-group per thread

    def cost(self, p, c) -> float:
        """One GEMM per (image, group): its B panels packed from the image (the columns read and written
        once), the image first copied zero-padded when the layer pads, the filters (A) packed once for all
        products. While there are as many products as threads, a thread runs whole products, so a narrow
        plane costs less than in one GEMM split across the threads; the products left over (every one at
        batch 1 with one group) run one at a time on all threads, as the blocked GEMM splits one."""
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        full, crs, tasks = FULL_WIDTH_COLUMNS, cg * p.kh * p.kw, n * g
        whole = tasks // c.threads * c.threads
        alone = gemm_efficiency(kg, max(pq, full), crs) * min(1.0, pq / full) ** 0.25
        shared = gemm_efficiency(kg, pq, crs)
        t = direct / c.peak(p) * (whole / alone + (tasks - whole) / shared) / max(tasks, 1)
        t += 2 * n * ch * p.kh * p.kw * pq * p.itemsize / c.bandwidth
        t += 2 * k * cg * p.kh * p.kw * p.itemsize / c.bandwidth
        if p.ph or p.pw:
            t += 3 * n * ch * (p.ih + 2 * p.ph) * (p.iw + 2 * p.pw) * p.itemsize / c.bandwidth
        return t


class _Winograd(_CpuConv):
    """Winograd in one direction; m (and name, tolerance) come from _F2x2 or _F4x4."""
    nonfinite = "tiles"
    direction = "fwd"
    op = "conv2d_fwd"

    def supports(self, p) -> str | None:
        reason = super().supports(p)
        if reason:
            return reason
        if (p.kh, p.kw) != (3, 3):
            return f"needs a 3x3 filter, got {p.kh}x{p.kw}"
        if (p.sh, p.sw) != (1, 1):
            return f"needs stride 1, got {p.sh}x{p.sw}"
        if (p.dh, p.dw) != (0, 0):
            return f"needs dilation 1, got {p.dh + 1}x{p.dw + 1}"
        return None

    def chunk(self, p) -> int:
        bound = workspace_bound()
        return int(_cpu.winograd_tile_chunk(shape_tuple(p), self.m, bound // p.itemsize))

    def cost(self, p, c) -> float:
        """Chunks of 64 tiles as the micro-kernel's columns (the last one padded), or, at most 32 tiles (and
        no more than K/g), the tiles as exact rows and the channels padded to 64; alpha^2 products, the
        input and output transforms of every tile, the filter transforms."""
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        a2 = (self.m + 2) ** 2
        tiles = n * math.ceil(p.oh / self.m) * math.ceil(p.ow / self.m)
        few = tiles <= WINOGRAD_FEW_TILES and tiles <= kg
        mr = micro_rows(p.itemsize)
        rows, cols = (math.ceil(tiles / mr) * mr, math.ceil(kg / 64) * 64) if few else (kg, math.ceil(tiles / 64) * 64)
        peak = c.peak(p)
        t = 2 * a2 * rows * cols * cg * g / (peak * WINOGRAD_GEMM_EFFICIENCY)
        t += (cg + kg) * g * tiles * a2 * TRANSFORM_FLOPS / peak
        t += k * cg * a2 * (FILTER_FEW_FLOPS if few else FILTER_FLOPS) / peak
        return t


class _F2x2:
    """F(2x2, 3x3) in any direction."""
    name = kernel = "winograd_f2x2_3x3"
    m = 2
    tolerance = 1e-5


class _F4x4:
    """F(4x4, 3x3) in any direction: fewer multiplications, less accurate."""
    name = kernel = "winograd_f4x4_3x3"
    m = 4
    tolerance = 1e-4


class WinogradF2x2(_F2x2, _Winograd):
    pass


class WinogradF4x4(_F4x4, _Winograd):
    pass


def as_forward(p):
    """The forward convolution that computes p's backward data when p is 3x3, stride 1, dilation 1 and
    pads at most 2: dy convolved with the filters transposed per group and turned by 180 degrees, at
    padding 2 - ph, 2 - pw."""
    return dataclasses.replace(p, ic=p.oc, oc=p.ic, ih=p.oh, iw=p.ow, oh=p.ih, ow=p.iw, ph=2 - p.ph, pw=2 - p.pw,
                               direction="fwd", bias=False)


class _WinogradBwdData(_Winograd):
    op, direction = "conv2d_bwd_data", "bwd_data"

    def supports(self, p) -> str | None:
        reason = super().supports(p)
        if reason:
            return reason
        if p.ph > 2 or p.pw > 2:
            return f"needs padding at most 2 (run as a forward pass at padding 2 - p), got {p.ph}x{p.pw}"
        return None

    def chunk(self, p) -> int:
        return super().chunk(as_forward(p))

    def cost(self, p, c) -> float:
        """The forward pass on dy, its filter transforms reading the filters turned."""
        return super().cost(as_forward(p), c)


class WinogradF2x2BwdData(_F2x2, _WinogradBwdData):
    pass


class WinogradF4x4BwdData(_F4x4, _WinogradBwdData):
    pass


class _WinogradBwdFilter(_Winograd):
    op, direction = "conv2d_bwd_filter", "bwd_filter"

    def chunk(self, p) -> int:
        return 1  # the kernel cuts its chunks of tiles itself

    def cost(self, p, c) -> float:
        """The transposed algorithm: per point a GEMM over the tiles (WINOGRAD_BWD_DEPTH at a time: its
        depth, at the blocked GEMM's depth law) accumulated in M (alpha^2 x K/g x C/g a group), written by
        every chunk (the first write reading it in too), read by every chunk after the first and by the
        final transform; two transforms a tile as the forward pass has, each followed by a transpose into
        the panels (about twice the forward's cost)."""
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        a2 = (self.m + 2) ** 2
        tiles = n * math.ceil(p.oh / self.m) * math.ceil(p.ow / self.m)
        mr = micro_rows(p.itemsize)
        peak = c.peak(p)
        depth = min(tiles, WINOGRAD_BWD_DEPTH)
        efficiency = WINOGRAD_GEMM_EFFICIENCY * depth_efficiency(kg, cg, depth)
        t = 2 * a2 * math.ceil(kg / mr) * mr * cg * tiles * g / (peak * efficiency)
        t += 2 * (cg + kg) * g * tiles * a2 * TRANSFORM_FLOPS / peak
        chunks = math.ceil(tiles / WINOGRAD_BWD_DEPTH)
        t += a2 * kg * cg * g * p.itemsize * (2 * chunks + 1) / c.bandwidth
        return t


class WinogradF2x2BwdFilter(_F2x2, _WinogradBwdFilter):
    pass


class WinogradF4x4BwdFilter(_F4x4, _WinogradBwdFilter):
    pass


class DepthwiseFwd(_CpuConv):
    name = kernel = "depthwise"
    op = "conv2d_fwd"
    direction = "fwd"
    tolerance = 1e-5

    def supports(self, p) -> str | None:
        reason = super().supports(p)
        if reason:
            return reason
        if p.ic // p.g != 1:
            return f"needs one input channel per group (depthwise), got {p.ic // p.g}"
        return None

    def chunk(self, p) -> int:
        return get_num_threads()  # the workspace holds one padded plane per thread

    def cost(self, p, c) -> float:
        """Memory-bound: the padded input plane copied, then read, and the output written once."""
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        moved = (3 * n * ch * p.ih * p.iw + n * k * pq) * p.itemsize
        return moved / c.bandwidth + direct / (c.peak(p) * 0.1)


def _fast_len(n: int) -> int:
    """The smallest 5-smooth length (2^a 3^b 5^c) >= n: a real transform's fast sizes."""
    n = max(1, n)
    best = 1 << (n - 1).bit_length()  # the power of two at or above n
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            # the least p35 * 2^a >= n
            m = p35 if p35 >= n else p35 << (-(-n // p35) - 1).bit_length()
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


class FftFwd(_CpuConv):
    nonfinite = "all"
    name = "fft"
    op = "conv2d_fwd"
    direction = "fwd"
    tolerance = 1e-5

    def supports(self, p) -> str | None:
        reason = super().supports(p)
        if reason:
            return reason
        # Asked without importing it: scipy loads an OpenBLAS of its own, with its own threads, into the
        # process, which only a run of this algorithm needs.
        if importlib.util.find_spec("scipy") is None:
            return "needs scipy (pip install scipy)"
        return None

    @staticmethod
    def _sizes(p):
        hf = _fast_len(p.ih + 2 * p.ph)
        wf = _fast_len(p.iw + 2 * p.pw)
        return hf, wf, hf * (wf // 2 + 1)

    def _images_per_chunk(self, p) -> int:
        hf, wf, nf = self._sizes(p)
        bound = workspace_bound()
        c = 2 * p.itemsize  # bytes of one complex element
        per_image = (p.ic + p.oc) * nf * c + p.ic * hf * wf * p.itemsize + p.oc * hf * wf * p.itemsize
        fixed = self._filter_bytes(p)
        return int(max(1, min(p.mb, (bound - fixed) // max(per_image, 1))))

    def _filter_bytes(self, p) -> int:
        """The transformed filters, (F, 2*C/g, K) real."""
        _, _, nf = self._sizes(p)
        return nf * 2 * (p.ic // p.g) * p.oc * p.itemsize

    def cost(self, p, c) -> float:
        """The filters' DFT written as F x 2C/g x K reals (a fresh array: bound by first-touch writes), per
        frequency one real GEMM of 2n x 2C/g x K reading that once, and scipy's transforms of the padded
        inputs and outputs."""
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        hf, wf, freqs = self._sizes(p)
        w_bytes = freqs * 2 * cg * k * p.itemsize
        peak = c.peak(p)
        filters = 12 * w_bytes / c.bandwidth
        reduce = 8 * n * k * cg * freqs / (peak * 0.07) + w_bytes / c.bandwidth
        transforms = n * (ch + k) * hf * wf * 5 * math.log2(max(hf * wf, 2)) / (peak * 0.02)
        return filters + reduce + transforms

    def workspace_bytes(self, p) -> int:
        """Memory the transforms allocate (scipy.fft returns new arrays, so none is handed in)."""
        hf, wf, nf = self._sizes(p)
        nb = self._images_per_chunk(p)
        c = 2 * p.itemsize
        return int(self._filter_bytes(p) + nb * ((p.ic + p.oc) * nf * c + (p.ic + p.oc) * hf * wf * p.itemsize))

    def run(self, p, x, w, *, out, bias=None, workspace=None):
        import scipy.fft as sfft

        from .._config import get_num_threads

        nt = get_num_threads()
        hf, wf, nf = self._sizes(p)
        dt = x.dtype
        cg = p.ic // p.g
        # The filters' DFT on the hf x wf grid (dilated taps), straight into the reduction's layout.
        wt = np.empty((nf, 2 * cg, p.oc), dtype=dt)
        _cpu.fft_filter_transform(np.ascontiguousarray(w), wt, hf, wf, p.dh + 1, p.dw + 1)
        nb = self._images_per_chunk(p)
        ys = slice(0, (p.oh - 1) * p.sh + 1, p.sh)
        xs = slice(0, (p.ow - 1) * p.sw + 1, p.sw)
        for n0 in range(0, p.mb, nb):
            n1 = min(p.mb, n0 + nb)
            xp = np.zeros((n1 - n0, p.ic, hf, wf), dtype=dt)  # zero padding, then the image
            xp[:, :, p.ph : p.ph + p.ih, p.pw : p.pw + p.iw] = x[n0:n1]
            xf = np.ascontiguousarray(sfft.rfft2(xp, workers=nt).reshape(n1 - n0, p.ic, nf))
            del xp
            yf = np.empty((n1 - n0, p.oc, nf), dtype=xf.dtype)
            _cpu.fft_channel_reduce(xf, wt, yf, p.g)
            del xf
            # Circular correlation of size hf x wf equals the linear one on the valid region.
            full = sfft.irfft2(yf.reshape(n1 - n0, p.oc, hf, wf // 2 + 1), s=(hf, wf), workers=nt)
            out[n0:n1] = full[:, :, ys, xs]
            if bias is not None:
                out[n0:n1] += bias.reshape(1, -1, 1, 1)
        return out


class DirectFwd(_Direct):
    name, op, direction = "direct", "conv2d_fwd", "fwd"

    def cost(self, p, c) -> float:
        """The register blocks (_register_block_efficiency); each input row's loop is shared by the
        filter's taps along it, so wide filters run nearer the peak; a stride along the row splits each
        padded row into phases, one a tap along the row, which costs a filter wider than one tap about
        half its rate (bench/RESULTS.md, the direct algorithm's efficiency)."""
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        stride = 0.5 if p.sw > 1 and p.kw > 1 else 1.0  # each tap along the row reads its own phase
        return direct / (c.peak(p) * _register_block_efficiency(p.kh * p.kw, kg, p.ow) * stride)


def _register_block_efficiency(taps: int, channels: int, width: int) -> float:
    """The forward register blocks' share of the peak, for `channels` output channels a group and output
    rows `width` wide: blocks of 4 channels (taken as AVX2's) x 24 columns, filled as far as the shape
    allows; under 4 channels a group, blocks of one channel, whose every input load feeds one
    multiply-add (about 0.3 of a full block's rate). Conservative: it under-predicts the kernels by up
    to 2x on 1x1 layers (bench/RESULTS.md), as the GEMM paths' formulas over-predict those layers by as
    much; fitted alone it would take them from the faster GEMM."""
    kb = 4 if channels >= 4 else 1
    fill = channels / (kb * math.ceil(channels / kb)) * (1.0 if kb == 4 else 0.3)
    return 0.9 * taps / (taps + 1.7) * fill * width / (24 * math.ceil(width / 24))


class DirectBwdData(_Direct):
    name, op, direction = "direct", "conv2d_bwd_data", "bwd_data"

    def cost(self, p, c) -> float:
        """At unit stride (padding within the filter's reach) the forward's register blocks over dy, with
        the input's channels and width as the output's; at other strides (undilated) one such forward a
        stride phase of dx; otherwise a scalar loop."""
        n, ch, k, g, cg, kg, pq, direct = _dims(p)
        if p.sh == p.sw == 1 and p.ph <= (p.kh - 1) * (p.dh + 1) and p.pw <= (p.kw - 1) * (p.dw + 1):
            return direct / (c.peak(p) * _register_block_efficiency(p.kh * p.kw, cg, p.iw))
        if (p.dh, p.dw) == (0, 0) and _phases_padded(p.sh, p.ph, p.kh, p.ih) and _phases_padded(p.sw, p.pw, p.kw, p.iw):
            # one forward a stride phase, over its share of the taps, then spread into dx
            taps = math.ceil(p.kh / p.sh) * math.ceil(p.kw / p.sw)
            spread = 2 * n * ch * p.ih * p.iw * p.itemsize / c.bandwidth
            return direct / (c.peak(p) * _register_block_efficiency(taps, cg, math.ceil(p.iw / p.sw))) + spread
        return direct / (c.peak(p) * 0.06)


def _phases_padded(stride: int, pad: int, size: int, out: int) -> bool:
    """csrc/conv/direct.cpp phase_of: every stride phase of the backward data along an axis that has outputs
    and taps needs no negative padding as a forward correlation."""
    for f in range(min(stride, out)):
        r0 = (f + pad) % stride
        if r0 < size and (size - 1 - r0) // stride - (f + pad - r0) // stride < 0:
            return False
    return True


class DirectBwdFilter(_Direct):
    name, op, direction = "direct", "conv2d_bwd_filter", "bwd_filter"

    def cost(self, p, c) -> float:
        """An accumulator a tap (filters of up to 3 taps several filters at once), each output row's
        vectors summed apart, so short rows pay their partial last vector, and a filter of few taps pays
        more for them and for its sums; a stride along the row makes each image's padded rows a gather
        into phases, which a filter of few taps amortizes least (bench/RESULTS.md, the direct algorithm's
        efficiency)."""
        taps, r = p.kh * p.kw, p.ow / (p.ow + 24)
        eff = 0.8 * r ** 1.5 if taps > 3 else 0.65 * r ** 2.5
        if p.sw > 1:
            eff *= 0.65 if taps > 3 else 0.45
        return _dims(p)[-1] / (c.peak(p) * eff)


# The registry's convolution algorithms, per direction in order of preference (algos/__init__.py
# registers them).
ALGORITHMS = [
    Im2colGemmFwd(), ImplicitGemmFwd(), WinogradF4x4(), WinogradF2x2(), FftFwd(), DepthwiseFwd(), DirectFwd(),
    GemmCol2imBwdData(), WinogradF4x4BwdData(), WinogradF2x2BwdData(), DirectBwdData(),
    Im2colGemmBwdFilter(), WinogradF4x4BwdFilter(), WinogradF2x2BwdFilter(), DirectBwdFilter(),
]

def bias_grad(dy: np.ndarray, db: np.ndarray) -> np.ndarray:
    """db[k] = dy[:, k] summed over N, H and W (dy C-contiguous), as the kernel of a 1x1 convolution of K
    channels that sums each output channel's plane."""
    n, k, h, w = dy.shape
    _cpu.conv2d("bwd_bias", "sum", (n, k, h, w, k, 1, 1, h, w, 1, 1, 0, 0, 1, 1, 1), dy, None, None, db, None, 1)
    return db
