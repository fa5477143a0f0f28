// Winograd F(m x m, 3 x 3) forward convolution, m in {2, 4} (winograd.cpp). Requires 3x3 filters,
// stride 1, dilation 1; any padding and groups.
#pragma once
#include "conv.h"

namespace dnnkit {

// Tiles per chunk (1 to 64): the unit of work a thread transforms and multiplies in its own buffers.
index_t winograd_tile_chunk(const ConvShape& sh, int m, index_t max_workspace_elems);
// Workspace elements (of elem_size bytes) for tile chunk tc on get_num_threads() threads: the packed
// transformed filters and per thread one chunk's V and one M block (or, at most 32 tiles, the
// transformed input and per thread a block of transformed filters and of M), with alignment slack.
index_t winograd_workspace_elems(const ConvShape& sh, int m, index_t tc, index_t elem_size);

template <typename T>
void conv2d_fwd_winograd(const ConvShape& sh, int m, const T* x, const T* w, const T* bias, T* y, T* ws, index_t tc);

// Backward data (stride 1, dilation 1, ph and pw at most 2) as the forward algorithm on dy with the
// filters transposed and turned by 180 degrees (read so out of w): the forward problem it runs, and its
// workspace (the forward pass's for tile chunk tc of that problem).
ConvShape winograd_bwd_data_as_fwd(const ConvShape& sh);
index_t winograd_bwd_data_workspace_elems(const ConvShape& sh, int m, index_t tc, index_t elem_size);
template <typename T>
void conv2d_bwd_data_winograd(const ConvShape& sh, int m, const T* w, const T* dy, T* dx, T* ws, index_t tc);

// Backward filter (3x3, stride 1, dilation 1, any padding) by the transposed algorithm F(3x3, m x m):
// per transform point, the sum over tiles of the transformed gradient and input tiles as GEMMs over
// chunks of tiles. Workspace: one chunk's transformed input and gradient panels, and the alpha^2 x Kg x
// Cg sums of one group.
index_t winograd_bwd_filter_workspace_elems(const ConvShape& sh, int m, index_t elem_size);
template <typename T>
void conv2d_bwd_filter_winograd(const ConvShape& sh, int m, const T* x, const T* dy, T* dw, T* ws);

}  // namespace dnnkit
