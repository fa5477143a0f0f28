"""CPU convolution algorithms (csrc/conv), forward and both backward passes.

im2col_gemm (fwd, bwd_filter) / gemm_col2im (bwd_data): lower to dnnkit's blocked GEMM through a column
    buffer of (C/G*R*S) x chunk elements, chunk output pixels at a time so the workspace stays under a
    bound; 1x1 stride-1 unpadded convolutions use the input directly, with no workspace. The forward
    pass puts several images side by side in one GEMM when an image's output plane is small.
winograd_f2x2_3x3 / winograd_f4x4_3x3 (fwd): F(m x m, 3 x 3) for 3x3 stride-1 dense filters: filter,
    input and output transforms in C++ around alpha^2 transform-domain GEMMs on dnnkit's GEMM, tiles
    processed in workspace-bounded chunks. F(4x4) is less accurate (tolerance 1e-4 in float32).
direct: loops over the output with the padding bounds hoisted and the inner loop along an output row;
    no workspace; every shape.
"""
from __future__ import annotations

from .. import _cpu
from .._config import get_workspace_limit
from .base import Algorithm

# Bound on the im2col column buffer when the user sets no tighter workspace limit.
DEFAULT_COL_BYTES = 64 << 20


def shape_tuple(p) -> tuple:
    """The kernels' shape: (n, c, h, w, k, r, s, p, q, sh, sw, ph, pw, dh, dw, g), dilation 1-based."""
    return (p.mb, p.ic, p.ih, p.iw, p.oc, p.kh, p.kw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw, p.dh + 1, p.dw + 1, p.g)


class _CpuConv(Algorithm):
    backend = "cpu"
    kernel = ""       # the C++ kernel's name in _cpu.conv2d
    direction = ""    # "fwd", "bwd_data" or "bwd_filter"

    def supports(self, p) -> str | None:
        if p.device != "cpu":
            return f"runs on the CPU, the problem is on {p.device}"
        if p.dtype not in ("float32", "float64"):
            return f"dtype {p.dtype} is not float32 or float64"
        return None

    def chunk(self, p) -> int:
        return 1

    def run(self, p, a0, a1, *, out, bias=None, workspace=None):
        """fwd: (x, w) -> out = y; bwd_data: (w, dy) -> out = dx; bwd_filter: (x, dy) -> out = dw.
        All arrays C-contiguous of p.dtype; workspace a 1-D array of workspace_bytes(p) bytes or None."""
        _cpu.conv2d(self.direction, self.kernel, shape_tuple(p), a0, a1, bias, out, workspace, self.chunk(p))
        return out


class _Im2col(_CpuConv):
    tolerance = 1e-5
    batch_images = False  # forward only: several small images side by side in one GEMM

    def chunk(self, p) -> int:
        limit = get_workspace_limit()
        bound = DEFAULT_COL_BYTES if limit is None else min(limit, DEFAULT_COL_BYTES)
        return int(_cpu.im2col_chunk(shape_tuple(p), bound // p.itemsize, self.batch_images))

    def workspace_bytes(self, p) -> int:
        return int(_cpu.col_elems(shape_tuple(p), self.chunk(p))) * p.itemsize


class _Direct(_CpuConv):
    tolerance = 1e-5
    kernel = "direct"


class Im2colGemmFwd(_Im2col):
    name, op, kernel, direction = "im2col_gemm", "conv2d_fwd", "im2col_gemm", "fwd"
    batch_images = True


class GemmCol2imBwdData(_Im2col):
    name, op, kernel, direction = "gemm_col2im", "conv2d_bwd_data", "gemm_col2im", "bwd_data"


class Im2colGemmBwdFilter(_Im2col):
    name, op, kernel, direction = "im2col_gemm", "conv2d_bwd_filter", "im2col_gemm", "bwd_filter"


class _Winograd(_CpuConv):
    direction = "fwd"
    op = "conv2d_fwd"
    m = 4

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
        limit = get_workspace_limit()
        bound = DEFAULT_COL_BYTES if limit is None else min(limit, DEFAULT_COL_BYTES)
        return int(_cpu.winograd_tile_chunk(shape_tuple(p), self.m, bound // p.itemsize))

    def workspace_bytes(self, p) -> int:
        return int(_cpu.winograd_workspace_elems(shape_tuple(p), self.m, self.chunk(p))) * p.itemsize


class WinogradF2x2(_Winograd):
    name = kernel = "winograd_f2x2_3x3"
    m = 2
    tolerance = 1e-5


class WinogradF4x4(_Winograd):
    name = kernel = "winograd_f4x4_3x3"
    m = 4
    tolerance = 1e-4


class DirectFwd(_Direct):
    name, op, direction = "direct", "conv2d_fwd", "fwd"


class DirectBwdData(_Direct):
    name, op, direction = "direct", "conv2d_bwd_data", "bwd_data"


class DirectBwdFilter(_Direct):
    name, op, direction = "direct", "conv2d_bwd_filter", "bwd_filter"
