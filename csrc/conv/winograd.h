// Winograd F(m x m, 3 x 3) forward convolution, m in {2, 4} (winograd.cpp). Requires 3x3 filters,
// stride 1, dilation 1; any padding and groups.
#pragma once
#include "conv.h"

namespace dnnkit {

// Tiles per chunk for a workspace of at most max_workspace_elems elements (at least 1).
index_t winograd_tile_chunk(const ConvShape& sh, int m, index_t max_workspace_elems);
// Workspace elements for tile chunk tc: transformed filters, plus V and M for tc tiles.
index_t winograd_workspace_elems(const ConvShape& sh, int m, index_t tc);

template <typename T>
void conv2d_fwd_winograd(const ConvShape& sh, int m, const T* x, const T* w, const T* bias, T* y, T* ws, index_t tc);

}  // namespace dnnkit
