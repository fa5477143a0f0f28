"""Convolution algorithms on shapes around their schedules' boundaries, on every ISA and thread count (the
isa and num_threads fixtures): Winograd's chunked and few-tiles schedules, images side by side in one
product, the backward passes' column chunks, strided 1x1 columns and implicit_gemm's panels."""
from __future__ import annotations

import numpy as np
import pytest

import dnnkit
from conv_cases import (
    ALGOS, ConvCase, _check_output, _problem, _run_poisoned, arrays, check_backward_data, check_backward_filter,
    check_forward, expected_forward,
)
from dnnkit.problem import ConvProblem
from helpers import DTYPES

WINOGRAD_EDGE_SHAPES = [
    # (n, c, k, h, w, groups, padding): both schedules and their boundaries
    (1, 24, 70, 6, 6, 1, 1),     # few tiles (9 for F(2x2), 4 for F(4x4)), two output-channel blocks, tails
    (1, 12, 40, 9, 7, 2, 1),     # few tiles per group, groups
    (1, 100, 40, 5, 5, 1, 1),    # few tiles, several input-channel blocks of U^T with a short last one
    (2, 3, 5, 1, 1, 1, 1),       # outputs smaller than a tile, one tile per image
    (1, 5, 7, 16, 16, 1, 1),     # exactly 64 tiles (F(2x2)): one whole chunk
    (1, 5, 7, 18, 16, 1, 1),     # 72 tiles: a chunk and a short one (threads share the chunks)
    (3, 6, 30, 20, 22, 3, 2),    # many chunks per group, a partial last chunk, padding 2
    (1, 7, 13, 4, 5, 1, 0),      # valid padding, a 2x3 output
    (1, 4, 100, 40, 40, 1, 1),   # chunked, with more output channels than one M block (blocks on MR panels)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_winograd_schedules_and_chunk_boundaries(isa, num_threads, dtype):
    """Winograd's chunked and few-tiles schedules on shapes around their boundaries, on every ISA's
    micro-kernel (MR, NR) and thread count, with the output and the workspace poisoned with NaN."""
    _winograd_schedules("fwd", WINOGRAD_EDGE_SHAPES, dtype, True, 100)


def _winograd_schedules(direction, shapes, dtype, bias, seed):
    """Every Winograd algorithm of direction on the 3x3 stride-1 shapes (n, c, k, h, w, groups, padding),
    which it must support, through _run_poisoned."""
    for algo in (a for a in ALGOS[direction] if a.name.startswith("winograd")):
        for i, (n, c, k, h, w, g, pad) in enumerate(shapes):
            case = ConvCase(n, c, k, h, w, 3, 3, g, 1, pad, 1, dtype, bias, "C", seed + i)
            p = _problem(case, direction)
            assert algo.supports(p) is None
            _run_poisoned(algo, case, direction, p)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_winograd_backward_data_schedules(isa, num_threads, dtype):
    """Backward data by Winograd (the forward pass on dy with the filters turned, at padding 2 - p) on the
    same shapes, on every ISA and thread count, output and workspace poisoned with NaN; padding 3 is
    refused with its reason."""
    _winograd_schedules("bwd_data", WINOGRAD_EDGE_SHAPES, dtype, False, 150)
    p3 = ConvProblem.parse("mb1ic4ih5oc4oh9kh3ph3", direction="bwd_data")
    for algo in (a for a in ALGOS["bwd_data"] if a.name.startswith("winograd")):
        assert "padding at most 2" in algo.supports(p3)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_winograd_backward_filter_schedules(isa, num_threads, dtype):
    """Backward filter by Winograd (the transposed algorithm, tiles as the GEMM's depth in chunks of 256)
    on the same shapes and on more tiles than one chunk, on every ISA and thread count, output and
    workspace poisoned with NaN."""
    shapes = WINOGRAD_EDGE_SHAPES + [(3, 6, 9, 48, 40, 1, 1),    # 360 tiles (F(4x4)), 1440 (F(2x2)): 2 and 6 chunks
                                     (1, 33, 5, 44, 23, 1, 2)]    # 84 tiles (F(4x4)), 299 (F(2x2)): 1 and 2 chunks
    _winograd_schedules("bwd_filter", shapes, dtype, False, 170)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_pointwise_images_side_by_side(isa, num_threads, dtype):
    """1x1 stride-1 convolutions on small planes, forward and backward data, several images in one GEMM
    whose B is packed straight from the input (gradient) planes: panels that straddle two or more images (planes of 1, 5x5, 3x7 pixels against
    every micro-kernel's NR), groups, a batch that does not fill the last chunk, strided input."""
    algo = next(a for a in ALGOS["fwd"] if a.name == "im2col_gemm")
    bwd = next(a for a in ALGOS["bwd_data"] if a.name == "gemm_col2im")  # the same batching, gradient planes
    for i, (n, c, k, h, w, g, layout) in enumerate([(3, 5, 7, 5, 5, 1, "C"), (5, 4, 9, 3, 7, 1, "strided"),
                                                    (9, 6, 4, 1, 1, 2, "C"), (4, 8, 8, 6, 5, 4, "C"),
                                                    (6, 9, 3, 4, 4, 1, "C")]):
        case = ConvCase(n, c, k, h, w, 1, 1, g, 1, 0, 1, dtype, True, layout, 200 + i)
        check_forward(algo, case)
        check_backward_data(bwd, case)


def test_backward_filter_threads_columns_in_chunks_of_whole_rows():
    """im2col_gemm's backward filter where the threads take whole images (a small dW) and one image's
    columns exceed a quarter of a thread's share of L3: each image in chunks of whole output rows
    (conv.h), the last one shorter, summed into the same dW as one chunk would give."""
    l3 = dnnkit._cpu.l3_cache_bytes()
    crs, itemsize = 8 * 7 * 7, 8
    fit = l3 // (4 * 2 * crs * itemsize)  # columns a chunk holds on two threads
    side = int(np.ceil(np.sqrt(1.5 * fit))) + 1  # a plane of about 1.5 chunks: P = H at padding 3
    if not l3 or side > 160:
        pytest.skip(f"an L3 of {l3} bytes needs too large a plane for this test")
    algo = next(a for a in ALGOS["bwd_filter"] if a.name == "im2col_gemm")
    before = dnnkit.get_num_threads()
    try:
        dnnkit.set_num_threads(2)
        check_backward_filter(algo, ConvCase(2, 8, 4, side, side + 1, 7, 7, 1, 1, 3, 1, np.float64, False, "C", 500))
    finally:
        dnnkit.set_num_threads(before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_backward_data_images_side_by_side_before_col2im(isa, num_threads, dtype):
    """gemm_col2im's backward data on small planes of kernels other than 1x1 stride 1: the columns of
    several images side by side (one GEMM whose B is packed from their gradient planes), then col2im
    image by image from its part of them. 3x3 with padding, 1x1 stride 2 (input pixels no column covers),
    dilation and groups, a plane of one pixel, strided input, and a workspace limit that leaves a last
    chunk of fewer images."""
    algo = next(a for a in ALGOS["bwd_data"] if a.name == "gemm_col2im")
    shapes = [  # n, c, k, h, w, r, groups, stride, padding, dilation, layout
        (5, 4, 6, 5, 5, 3, 1, 1, 1, 1, "C"), (4, 6, 8, 7, 6, 1, 2, 2, 0, 1, "strided"),
        (3, 4, 6, 7, 7, 3, 2, 1, 2, 2, "C"), (6, 3, 5, 3, 3, 3, 1, 1, 0, 1, "C")]
    cases = [ConvCase(n, c, k, h, w, r, r, g, stride, pad, dil, dtype, False, layout, 400 + i)
             for i, (n, c, k, h, w, r, g, stride, pad, dil, layout) in enumerate(shapes)]
    for case in cases:
        p = _problem(case, "bwd_data")
        assert algo.chunk(p) >= 2 * p.oh * p.ow  # images side by side
        check_backward_data(algo, case)
    before = dnnkit.get_workspace_limit()
    try:  # two images a chunk of the first shape (CRS 36 + 6 output rows, 25 pixels): chunks of 2, 2 and 1
        dnnkit.set_workspace_limit(2 * np.dtype(dtype).itemsize * (36 + 6) * 25)
        assert algo.chunk(_problem(cases[0], "bwd_data")) == 2 * 25
        check_backward_data(algo, cases[0])
    finally:
        dnnkit.set_workspace_limit(before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_forward_strided_1x1_columns(isa, num_threads, dtype):
    """im2col_gemm's forward on 1x1 filters without padding at strides other than 1, whose columns sample
    the input in place (no bounds test): output rows of fewer and more than 8 pixels (the stride-2 copy's
    vectors), odd strides, groups, small planes of several images side by side, a strided input, and a
    workspace limit that starts chunks in the middle of an output row."""
    algo = next(a for a in ALGOS["fwd"] if a.name == "im2col_gemm")
    shapes = [  # n, c, k, h, w, groups, stride, layout
        (3, 5, 6, 13, 14, 1, 2, "C"), (2, 4, 6, 9, 37, 2, 2, "strided"), (1, 3, 5, 11, 40, 1, (3, 2), "C"),
        (2, 6, 9, 10, 9, 3, (2, 3), "C"), (4, 8, 7, 7, 7, 1, 2, "C")]
    cases = [ConvCase(n, c, k, h, w, 1, 1, g, stride, 0, 1, dtype, True, layout, 600 + i)
             for i, (n, c, k, h, w, g, stride, layout) in enumerate(shapes)]
    for case in cases:
        check_forward(algo, case)
    before = dnnkit.get_workspace_limit()
    try:  # the third shape (3 x 4 x 20 output, CRS 3): chunks of 7 pixels, most starting mid-row
        dnnkit.set_workspace_limit(7 * 3 * np.dtype(dtype).itemsize)
        assert algo.chunk(_problem(cases[2], "fwd")) == 7
        check_forward(algo, cases[2])
    finally:
        dnnkit.set_workspace_limit(before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_backward_filter_images_side_by_side_along_the_depth(isa, num_threads, dtype):
    """im2col_gemm's backward filter on planes under 128 pixels: several images' dY rows and columns
    gathered along one product's depth (conv.h, Batching::depth). 1x1 (the planes copied), 1x1 stride 2
    and 3x3 (im2col per image), groups, a dW over the size threads keep private copies of (so the shared
    path runs on two threads too), and a workspace limit that leaves a last chunk of fewer images."""
    algo = next(a for a in ALGOS["bwd_filter"] if a.name == "im2col_gemm")
    shapes = [  # n, c, k, h, w, r, groups, stride, padding, layout
        (5, 6, 8, 5, 5, 1, 1, 1, 0, "C"), (4, 8, 6, 7, 6, 1, 2, 2, 0, "strided"), (3, 4, 5, 6, 6, 3, 1, 1, 1, "C"),
        (3, 300, 230, 3, 3, 1, 1, 1, 0, "C"), (6, 4, 6, 1, 1, 1, 2, 1, 0, "C")]
    cases = [ConvCase(n, c, k, h, w, r, r, g, stride, pad, 1, dtype, False, layout, 300 + i)
             for i, (n, c, k, h, w, r, g, stride, pad, layout) in enumerate(shapes)]
    for case in cases:
        check_backward_filter(algo, case)
    before = dnnkit.get_workspace_limit()
    try:  # two images a chunk of the first shape (8 + 6 values a pixel): chunks of 2, 2 and 1
        dnnkit.set_workspace_limit(2 * np.dtype(dtype).itemsize * (8 + 6) * 25)
        if num_threads == 1:
            assert algo.chunk(_problem(cases[0], "bwd_filter")) == 2 * 25
            check_backward_filter(algo, cases[0])
    finally:
        dnnkit.set_workspace_limit(before)
    if num_threads == 1:
        assert algo.chunk(_problem(cases[0], "bwd_filter")) == 5 * 25  # all five images in one product
    assert algo.chunk(_problem(cases[3], "bwd_filter")) == 3 * 9  # dW of 69,000 values: shared


# (n, c, k, h, w, r, s, groups, stride, padding, dilation): implicit_gemm's B panels against its runs
IMPLICIT_EDGE_SHAPES = [
    (3, 4, 5, 6, 1, 3, 1, 1, 1, (1, 0), 1),     # one output column: every panel column its own run
    (2, 40, 6, 5, 7, 3, 3, 1, 1, 1, 1),         # 360-deep columns: more than one k block
    (5, 6, 4, 4, 8, 3, 3, 2, 1, 1, 1),          # a 4x8 plane (32 pixels), groups, batch not a multiple of 2
    (1, 3, 7, 3, 11, 2, 3, 1, 1, (0, 1), 1),    # 33 pixels in runs of 11, one image on all threads
    (2, 5, 3, 9, 9, 3, 3, 1, (2, 3), 4, (2, 1)),  # stride, dilation, padding wider than the filter
    (2, 2, 3, 2, 2, 5, 5, 1, 1, 3, 1),          # mostly padding
    (3, 3, 4, 5, 7, 3, 3, 1, 1, 0, 1),          # no padding: the input itself, its last run copied exactly
    (2, 6, 9, 9, 6, 1, 1, 3, (2, 1), 0, 1),     # 1x1 with stride, groups, no padding
    (3, 2, 2100, 3, 4, 1, 2, 1, 1, 1, 1),       # more output channels than one M block of packed filters
    (2, 3, 4, 9, 40, 3, 3, 1, 2, 1, 1),         # stride 2 along rows of 20 outputs: the vector gather
    (1, 2, 3, 5, 41, 1, 1, 1, 2, 0, 1),         # stride 2, no padding: the last run ends at x's last element
    (1, 2, 3, 5, 31, 1, 1, 1, 2, 0, 1),         # rows of 16 outputs, each a whole vector block, the last at x's end
    (1, 2, 3, 5, 15, 1, 1, 1, 2, 0, 1),         # rows of 8 outputs (a float32 block, two float64 ones)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_implicit_gemm_panels_and_threads(isa, num_threads, dtype):
    """implicit_gemm's packing of the columns straight from the padded image, on every ISA's NR and
    thread count: output rows split across panels, one-column rows, deep columns, strides, dilation and
    padding wider than the filter, the per-thread and all-thread schedules, filters packed in more than
    one block; output and workspace poisoned with NaN."""
    algo = next(a for a in ALGOS["fwd"] if a.name == "implicit_gemm")
    for i, (n, c, k, h, w, r, s, g, stride, pad, dil) in enumerate(IMPLICIT_EDGE_SHAPES):
        case = ConvCase(n, c, k, h, w, r, s, g, stride, pad, dil, dtype, True, "C", 300 + i)
        x, wt, b, _ = arrays(case)
        p = ConvProblem.from_arrays(case.x_shape, case.w_shape, **case.args, dtype=np.dtype(dtype).name, bias=True)
        # odd cases: a workspace that starts off the 64-byte alignment the packed filters are placed at
        nelems = algo.workspace_bytes(p) // np.dtype(dtype).itemsize
        workspace = np.full(nelems + 1, np.nan, dtype)[i % 2:][:nelems]
        out = np.full(p.output_shape, np.nan, dtype)
        algo.run(p, x, wt, out=out, bias=b, workspace=workspace)
        _check_output(out, expected_forward(case, x, wt, b), np.dtype(dtype), algo, case)
