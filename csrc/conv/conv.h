// 2-D convolution on the CPU, NCHW, groups, stride, padding and dilation. Letters as everywhere in
// dnnkit: input N x C x H x W, weight K x (C/G) x R x S, output N x K x P x Q, G groups.
//
//   y[n, k, p, q] = bias[k] + sum_{c in group(k), r, s} w[k, c, r, s] * x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw]
//
// (x is zero outside its H x W extent; dh, dw are 1-based here: 1 = dense.)
#pragma once
#include <algorithm>

#include "../common.h"

namespace dnnkit {

struct ConvShape {
  index_t n, c, h, w;  // input
  index_t k, r, s;     // weight: k x (c/g) x r x s
  index_t p, q;        // output spatial size
  index_t sh, sw, ph, pw, dh, dw;
  index_t g;
  index_t cg() const { return c / g; }  // input channels per group
  index_t kg() const { return k / g; }  // output channels per group
  index_t crs() const { return cg() * r * s; }
  index_t pq() const { return p * q; }
  // 1x1, stride 1, no padding: the input plane of a group is already the GEMM's B matrix.
  bool is_pointwise() const { return r == 1 && s == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// ---- im2col + GEMM (im2col.cpp). `col` is caller-owned workspace of col_elems(shape, chunk) elements;
// output pixels are processed `chunk` at a time so the workspace stays bounded.
// When one image's output plane is too narrow for the GEMM (fewer than kMinGemmColumns pixels), a chunk
// may cover several whole images side by side: along the GEMM's columns (the forward, and the backward
// data of a 1x1 layer; the output block is then copied back to NCHW), or along its depth (the backward
// filter: nb images' dY rows and columns gathered, one product nb*PQ deep instead of nb that each read
// and write all of dW).
constexpr index_t kMinGemmColumns = 512;
// Along the depth, only planes under kMinGemmDepth pixels: below it one image's product is too shallow
// for the dW it reads and writes (res5's 1x1 layers), above it gathering dY costs more than it saves
// (res4's); bench/ab.py --filter bwd_filter.
constexpr index_t kMinGemmDepth = 128;
enum class Batching { none, columns, depth };

// Rows of the GEMM's output block when images go side by side along its columns: Kg (forward) or Cg
// (backward data of a 1x1 convolution); one size fits both.
inline index_t batched_out_rows(const ConvShape& sh) { return std::max(sh.kg(), sh.cg()); }

// Workspace elements one image takes when images go side by side.
inline index_t batched_elems_per_image(const ConvShape& sh, Batching b) {
  if (b == Batching::depth) return (sh.kg() + sh.crs()) * sh.pq();  // its dY rows and its columns
  return ((sh.is_pointwise() ? 0 : sh.crs()) + batched_out_rows(sh)) * sh.pq();  // 1x1: the GEMM reads x
}

// Output pixels per chunk (the GEMM's N, or its depth) for a workspace of at most max_workspace_elems.
index_t im2col_chunk(const ConvShape& sh, index_t max_workspace_elems, Batching batching);

// Images side by side in one GEMM for this chunk: 1 means one image at a time.
inline index_t images_per_chunk(const ConvShape& sh, index_t chunk) {
  const index_t pq = sh.pq();
  if (pq == 0 || pq >= kMinGemmColumns || sh.n < 2 || chunk < 2 * pq) return 1;
  return std::min<index_t>(sh.n, chunk / pq);
}

// Workspace elements for a chunk of the forward or the backward data: the column buffer, plus
// (batched) the GEMM's output block.
inline index_t col_elems(const ConvShape& sh, index_t chunk) {
  const index_t nb = images_per_chunk(sh, chunk);
  if (nb > 1) return batched_elems_per_image(sh, Batching::columns) * nb;
  return sh.is_pointwise() ? 0 : sh.crs() * chunk;
}

// Backward filter by im2col: with two images or more and a small dW (K x CRS, at most 64K values, a
// part of L2), threads take whole images, each with its own column buffer and partial dW, summed at the
// end, rather than splitting every narrow per-image GEMM (conv1's: 64 x 147, 12544 deep). A large dW is
// shared, the threads splitting each product; small planes then go side by side along the depth
// (res5's 1x1 layers: one product 392 deep rather than eight 49 deep, each reading and writing 4 MB).
constexpr index_t kBwdFilterPrivateMax = index_t(1) << 16;
inline int im2col_bwd_filter_threads(const ConvShape& sh) {
  if (sh.n < 2 || sh.k * sh.crs() > kBwdFilterPrivateMax) return 1;
  return static_cast<int>(std::min<index_t>(get_num_threads(), sh.n));
}
inline index_t im2col_bwd_filter_elems(const ConvShape& sh, index_t chunk) {
  const int nt = im2col_bwd_filter_threads(sh);
  if (nt <= 1) {
    const index_t nb = images_per_chunk(sh, chunk);
    return nb > 1 ? batched_elems_per_image(sh, Batching::depth) * nb : (sh.is_pointwise() ? 0 : sh.crs() * chunk);
  }
  return nt * (round_up(col_elems(sh, chunk), 16) + round_up(sh.k * sh.crs(), 16));
}

template <typename T>
void conv2d_fwd_im2col(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y, T* col, index_t chunk);
template <typename T>
void conv2d_bwd_data_col2im(const ConvShape& sh, const T* w, const T* dy, T* dx, T* col, index_t chunk);
template <typename T>
void conv2d_bwd_filter_im2col(const ConvShape& sh, const T* x, const T* dy, T* dw, T* col, index_t chunk);

// ---- implicit GEMM (implicit.cpp): the im2col product with B packed straight from the input. The
// workspace holds the filters packed once as the GEMM's A and, when the convolution pads, one
// zero-padded copy of an image-group's input planes per thread: implicit_workspace_elems<T>(shape,
// nthreads) elements; the kernel runs on as many threads as ws_elems has copies for (at most
// get_num_threads()). Throws std::bad_alloc if the GEMM's packing buffers cannot be allocated.
template <typename T>
index_t implicit_workspace_elems(const ConvShape& sh, int nthreads);
template <typename T>
void conv2d_fwd_implicit(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y, T* ws, index_t ws_elems);

// ---- depthwise (depthwise.cpp): one input channel per group (c / g == 1). The workspace holds one
// zero-padded input plane per thread: depthwise_workspace_elems(shape, nthreads) elements; the kernel
// runs on as many threads as ws_elems has planes for (at most get_num_threads()).
index_t depthwise_workspace_elems(const ConvShape& sh, int nthreads);
template <typename T>
void conv2d_fwd_depthwise(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y, T* ws, index_t ws_elems);

// ---- direct (direct.cpp): no workspace.
template <typename T>
void conv2d_fwd_direct(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y);
template <typename T>
void conv2d_bwd_data_direct(const ConvShape& sh, const T* w, const T* dy, T* dx);
template <typename T>
void conv2d_bwd_filter_direct(const ConvShape& sh, const T* x, const T* dy, T* dw);

// db[k] = sum over n, p, q of dy (accumulated in double).
template <typename T>
void conv2d_bwd_bias(const ConvShape& sh, const T* dy, T* db);

// The range [lo, hi) of output positions o (0 <= o < out) whose input position o*stride - pad + off lies
// in [0, in): the positions that read real input rather than padding.
inline void valid_range(index_t out, index_t in, index_t stride, index_t pad, index_t off, index_t* lo,
                        index_t* hi) {
  // o*stride >= pad - off  and  o*stride <= in - 1 + pad - off
  index_t a = pad - off;
  index_t l = a <= 0 ? 0 : (a + stride - 1) / stride;
  index_t b = in - 1 + pad - off;
  index_t h = b < 0 ? 0 : b / stride + 1;
  *lo = l < out ? l : out;
  *hi = h < out ? h : out;
  if (*hi < *lo) *hi = *lo;
}

}  // namespace dnnkit
