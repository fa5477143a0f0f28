// Packing routines for the GEMM driver. Source matrices are general strided views: element (r, c) of
// X lives at x[r*rs + c*cs], which covers row-major, transposed and non-contiguous NumPy views alike.
#pragma once
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "../common.h"
#include "../simd/vec.h"

namespace dnnkit {

// R rows of W elements (rows ld_in apart) to W rows of R elements (ld_out apart), R <= W:
// out[c*ld_out + r] = in[r*ld_in + c]. Rows past R are never read. Columns past R are never written,
// unless kWhole: then every output row is stored as a whole vector of W, its last W - R elements
// garbage, which the caller overwrites later (a panel written in increasing order: the next output row,
// or the next block's, starts there); one vector store an output row instead of a few narrower ones.
template <typename T, int R = static_cast<int>(kTransposeBlock<T>), bool kWhole = false>
__attribute__((always_inline)) inline void transpose_block(const T* in, index_t ld_in, T* out, index_t ld_out) {
  using V = TransposeVec<T>;
  constexpr int W = static_cast<int>(kTransposeBlock<T>);
  static_assert(R >= 1 && R <= W, "transpose_block: 1 <= R <= W");
  V r[W], t[W];
  for (int i = 0; i < R; ++i) std::memcpy(&r[i], in + i * ld_in, sizeof(V));
  for (int i = R; i < W; ++i) r[i] = V{};
  transpose_regs(r, t);
  for (int i = 0; i < W; ++i) std::memcpy(out + i * ld_out, &t[i], kWhole ? sizeof(V) : sizeof(T) * R);
}

// transpose_block for a run-time row count 1 <= rows <= W.
template <typename T, bool kWhole = false>
inline void transpose_block_rows(int rows, const T* in, index_t ld_in, T* out, index_t ld_out) {
  switch (rows) {
    case 1: return transpose_block<T, 1, kWhole>(in, ld_in, out, ld_out);
    case 2: return transpose_block<T, 2, kWhole>(in, ld_in, out, ld_out);
    case 3: return transpose_block<T, 3, kWhole>(in, ld_in, out, ld_out);
    default: break;
  }
  if constexpr (kTransposeBlock<T> == 8) {
    switch (rows) {
      case 4: return transpose_block<T, 4, kWhole>(in, ld_in, out, ld_out);
      case 5: return transpose_block<T, 5, kWhole>(in, ld_in, out, ld_out);
      case 6: return transpose_block<T, 6, kWhole>(in, ld_in, out, ld_out);
      case 7: return transpose_block<T, 7, kWhole>(in, ld_in, out, ld_out);
      default: break;
    }
  }
  transpose_block<T, static_cast<int>(kTransposeBlock<T>), kWhole>(in, ld_in, out, ld_out);
}

// d[l] = s[2*l] for l < n: vectors of 2W source elements (W = 32 bytes of T), their even elements
// picked by a shuffle. A vector reads one element past its last even one, which lies inside the run
// while l + W < n; a last block of exactly W (a whole panel's run) reads its second half one element
// earlier and takes its odd elements, so it reads nothing past s[2n - 2]; shorter tails go element by
// element.
template <typename T>
inline void copy_stride2(T* d, const T* s, index_t n) {
  using V = TransposeVec<T>;
  constexpr index_t W = kTransposeBlock<T>;
  static_assert(W == 8 || W == 4, "copy_stride2: 32-byte vectors of float or double");
  auto evens = [](const V& a, const V& b, bool shifted) {
    if constexpr (W == 8) {
      typedef int i8 __attribute__((vector_size(32)));
      return shifted ? V(__builtin_shuffle(a, b, i8{0, 2, 4, 6, 9, 11, 13, 15}))
                     : V(__builtin_shuffle(a, b, i8{0, 2, 4, 6, 8, 10, 12, 14}));
    } else {
      typedef long long i4 __attribute__((vector_size(32)));
      return shifted ? V(__builtin_shuffle(a, b, i4{0, 2, 5, 7})) : V(__builtin_shuffle(a, b, i4{0, 2, 4, 6}));
    }
  };
  index_t l = 0;
  for (; l + W <= n; l += W) {
    const bool last = l + W == n;
    V a, b;
    std::memcpy(&a, s + 2 * l, sizeof(V));
    std::memcpy(&b, s + 2 * l + W - (last ? 1 : 0), sizeof(V));
    const V even = evens(a, b, last);
    std::memcpy(d + l, &even, sizeof(V));
  }
  for (; l < n; ++l) d[l] = s[2 * l];
}

// k rows of N contiguous elements (rows rs apart) to k rows of exactly N: a copy of known size, which
// the compiler turns into vector moves (a run-time size is a call to memcpy for every row).
template <typename T, int N>
inline void copy_rows(index_t k, const T* src, index_t rs, T* dst) {
  for (index_t p = 0; p < k; ++p) std::memcpy(dst + p * N, src + p * rs, sizeof(T) * N);
}

// copy_rows for the panel widths the micro-kernels use; false for any other width.
template <typename T>
inline bool copy_rows_fixed(index_t k, int width, const T* src, index_t rs, T* dst) {
  switch (width) {
    case 4: copy_rows<T, 4>(k, src, rs, dst); return true;
    case 6: copy_rows<T, 6>(k, src, rs, dst); return true;
    case 8: copy_rows<T, 8>(k, src, rs, dst); return true;
    case 14: copy_rows<T, 14>(k, src, rs, dst); return true;
    case 16: copy_rows<T, 16>(k, src, rs, dst); return true;
    case 32: copy_rows<T, 32>(k, src, rs, dst); return true;
    case 64: copy_rows<T, 64>(k, src, rs, dst); return true;
    default: return false;
  }
}

// k lines of n contiguous values (lines ld apart) into panels of W values a line (panel q at
// dst + q*W*k, line p of it at + p*W), in groups of kLineGroup lines: a group's lines are read together,
// front to back (as many streams, which the hardware prefetchers follow), and each panel receives the
// group's lines as one contiguous run. The last panel, of n % W values a line, is zero-padded to W (kPad:
// B's panels, which the micro-kernel reads whole) or stored at its own width (A's tail panel, which the
// exact-height kernel runs). A line at a time, the stores of a line go to every panel, each k*W values
// from the next: with k*W*sizeof(T) a multiple of 4 KiB they share an L1 set and evict each other; in
// groups of 8 lines they do not (bench/log/2026-11-25-zen2-avx2-path.md).
constexpr index_t kLineGroup = 8;

template <typename T, int W, bool kPad>
void pack_panels_by_lines(index_t k, index_t n, const T* src, index_t ld, T* dst) {
  const index_t full = n / W, tail = n - full * W, tail_w = kPad ? W : tail;
  for (index_t p0 = 0; p0 < k; p0 += kLineGroup) {
    const index_t g = std::min(kLineGroup, k - p0);
    const T* s = src + p0 * ld;
    for (index_t q = 0; q < full; ++q) {
      T* d = dst + q * W * k + p0 * W;
      if (g == kLineGroup) {
#pragma GCC unroll 8
        for (index_t l = 0; l < kLineGroup; ++l) std::memcpy(d + l * W, s + l * ld + q * W, sizeof(T) * W);
      } else {
        for (index_t l = 0; l < g; ++l) std::memcpy(d + l * W, s + l * ld + q * W, sizeof(T) * W);
      }
    }
    if (tail) {
      T* d = dst + full * W * k + p0 * tail_w;
      for (index_t l = 0; l < g; ++l) {
        std::memcpy(d + l * tail_w, s + l * ld + full * W, sizeof(T) * tail);
        for (index_t j = tail; j < tail_w; ++j) d[l * tail_w + j] = T(0);
      }
    }
  }
}

// The k x n block of a row-major B (rows rs apart) into its micro-panels of the kernel's NR columns
// (the last zero-padded), rows outermost, so that B is read in order (panel by panel it would be read
// one short run a row); false for a width no micro-kernel uses.
template <typename T>
inline bool pack_b_rows_fixed(index_t k, index_t n, int nr, const T* b, index_t rs, T* bp) {
  switch (nr) {
    case 8: pack_panels_by_lines<T, 8, true>(k, n, b, rs, bp); return true;
    case 16: pack_panels_by_lines<T, 16, true>(k, n, b, rs, bp); return true;
    case 32: pack_panels_by_lines<T, 32, true>(k, n, b, rs, bp); return true;
    default: return false;
  }
}

// The m x k block of an A with contiguous columns (element (i, p) at a[i + p*cs]: the transposed
// operand of a weight gradient, dY^T X) into its micro-panels of the kernel's MR rows (the last at its
// own height), columns outermost, as B's rows are packed (one thread, 1024 x 256 outputs from depth
// 800-3200: 0.91 of the GEMM's time, where each k step of a panel copied 56 bytes from another line
// 4 KB away); false for a height no micro-kernel uses.
template <typename T>
inline bool pack_a_cols_fixed(index_t m, index_t k, int mr, const T* a, index_t cs, T* ap) {
  switch (mr) {
    case 4: pack_panels_by_lines<T, 4, false>(k, m, a, cs, ap); return true;
    case 6: pack_panels_by_lines<T, 6, false>(k, m, a, cs, ap); return true;
    case 8: pack_panels_by_lines<T, 8, false>(k, m, a, cs, ap); return true;
    case 14: pack_panels_by_lines<T, 14, false>(k, m, a, cs, ap); return true;
    default: return false;
  }
}

// Packs the m x k block of A into ceil(m/mr) micro-panels, each mr x k stored k-major
// (ap[panel*mr*k + p*mr + i]); rows past m are zero.
template <typename T>
void pack_a_panel(index_t m, index_t k, const T* a, index_t rs, index_t cs, int mr, T* ap) {
  // One micro-panel: m <= mr rows.
  if (rs == 1 && m == mr) {
    if (!copy_rows_fixed<T>(k, mr, a, cs, ap))
      for (index_t p = 0; p < k; ++p) std::memcpy(ap + p * mr, a + p * cs, sizeof(T) * mr);
    return;
  }
  if (cs == 1) {
    // Row-major A: groups of W rows by W k steps transposed in registers and stored as W panel rows
    // (a scalar scatter with stride mr writes each cache line of the panel mr times over). A group of
    // fewer than W rows (the last of a panel whose height is not a multiple of W: MR = 14 or 6 with W = 8)
    // loads only its rows. Each panel row is stored as whole vectors, the last group's overrunning the
    // row into the next ones: the groups of a block of W steps run last to first, so that a group's
    // overrun lands where a group run after it writes (the next panel rows, or the next block's). Where
    // an overrun would pass the end of the panel (k*mr values: the last blocks), exact widths.
    constexpr index_t W = kTransposeBlock<T>;
    const index_t last_group = (m - 1) / W * W;
    index_t p = 0;
    for (; p + W <= k; p += W) {
      const bool whole = (p + W - 1) * mr + last_group + W <= k * mr;
      for (index_t i0 = last_group; i0 >= 0; i0 -= W) {
        const index_t rows = std::min<index_t>(W, m - i0);  // m <= mr: the group ends inside the panel
        const T* src = a + i0 * rs + p;
        T* dst = ap + p * mr + i0;
        if (rows == W)
          transpose_block<T>(src, rs, dst, mr);
        else if (whole)
          transpose_block_rows<T, true>(static_cast<int>(rows), src, rs, dst, mr);
        else
          transpose_block_rows<T>(static_cast<int>(rows), src, rs, dst, mr);
      }
    }
    for (; p < k; ++p)
      for (index_t i = 0; i < m; ++i) ap[p * mr + i] = a[i * rs + p];
  } else {
    for (index_t p = 0; p < k; ++p)
      for (index_t i = 0; i < m; ++i) ap[p * mr + i] = a[i * rs + p * cs];
  }
  for (index_t i = m; i < mr; ++i)
    for (index_t p = 0; p < k; ++p) ap[p * mr + i] = T(0);
}

// Packs the k x n block of B into ceil(n/nr) micro-panels, each k x nr stored k-major
// (bp[panel*nr*k + p*nr + j]); columns past n are zero.
template <typename T>
void pack_b_panel(index_t k, index_t n, const T* b, index_t rs, index_t cs, int nr, T* bp) {
  if (cs == 1 && n == nr && copy_rows_fixed<T>(k, nr, b, rs, bp)) return;
  if (cs == 1) {
    for (index_t p = 0; p < k; ++p) {
      std::memcpy(bp + p * nr, b + p * rs, sizeof(T) * n);
      for (index_t j = n; j < nr; ++j) bp[p * nr + j] = T(0);
    }
    return;
  }
  if (rs == 1) {
    // Transposed B (the weight of a linear layer): each column is contiguous. W x W blocks (W columns by
    // W k steps) are loaded as vectors, transposed in registers and stored as rows of the panel. Groups
    // of W columns outermost, each read down its k range before the next: W sequential streams at a
    // time rather than all NR columns a few bytes each, which matters when B comes from memory (a 16 MB
    // weight: 6-8% of an LSTM cell at batch 64 and of linear at batch 64 and 256, timed in turns). The
    // column and k tails go element by element.
    constexpr index_t W = kTransposeBlock<T>;
    const index_t n_full = n / W * W, k_full = k / W * W;
    for (index_t j0 = 0; j0 < n_full; j0 += W)
      for (index_t p = 0; p < k_full; p += W) transpose_block<T>(b + j0 * cs + p, cs, bp + p * nr + j0, nr);
    for (index_t j = n_full; j < n; ++j)
      for (index_t p = 0; p < k_full; ++p) bp[p * nr + j] = b[j * cs + p];
    for (index_t p = k_full; p < k; ++p)
      for (index_t j = 0; j < n; ++j) bp[p * nr + j] = b[j * cs + p];
  } else {
    for (index_t p = 0; p < k; ++p)
      for (index_t j = 0; j < n; ++j) bp[p * nr + j] = b[p * rs + j * cs];
  }
  for (index_t p = 0; p < k; ++p)
    for (index_t j = n; j < nr; ++j) bp[p * nr + j] = T(0);
}

}  // namespace dnnkit
