// Implicit-GEMM forward convolution: the im2col product Y[n,g] (Kg x PQ) = W_g (Kg x CRS) @ col (CRS x PQ)
// with no column buffer. The GEMM packs its B operand through a callback that reads the input image, so
// each KC x NR panel of col is built once, in cache, right before the micro-kernel consumes it: one
// pass over the columns instead of three (im2col's write, then the packing's read and write). The
// image-group is first copied into zero-padded planes (unless the convolution has no padding), so that
// every column the filter reaches is a plain offset and a run of output pixels along a row (stride 1)
// is a contiguous copy.
//
// Threads: with at least as many (image, group) products as threads, each thread runs whole products on
// one thread (no barrier inside a product, each thread's B blocks in its own L2); the products left
// over, and batch 1, run on all threads at once.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "../gemm/gemm.h"
#include "../gemm/pack.h"
#include "../work_share.h"
#include "conv.h"
#include "kernels.h"

namespace dnnkit {
namespace {

constexpr int kMaxPanelCols = 64;  // no micro-kernel has a wider NR
constexpr index_t kRowBlock = 256; // panel rows whose offsets are tabled at once
template <typename T>
constexpr index_t kCopyChunk = 64 / sizeof(T);  // elements per fixed-size copy of a run: 64 bytes

// The zero-padded input plane extents: every position the filter reaches, ih + ph in [0, hp).
inline index_t padded_h(const ConvShape& sh) {
  return std::max(sh.ph + sh.h, (sh.p - 1) * sh.sh + (sh.r - 1) * sh.dh + 1);
}
inline index_t padded_w(const ConvShape& sh) {
  return std::max(sh.pw + sh.w, (sh.q - 1) * sh.sw + (sh.s - 1) * sh.dw + 1);
}
// Elements of one padded image-group: Cg padded planes.
inline index_t padded_elems(const ConvShape& sh) { return sh.cg() * padded_h(sh) * padded_w(sh); }

// xp (Cg x hp x wp, zero border) from the image-group's planes x (Cg x H x W).
template <typename T>
void pad_planes(const ConvShape& sh, const T* x, T* xp) {
  const index_t hp = padded_h(sh), wp = padded_w(sh);
  std::fill(xp, xp + padded_elems(sh), T(0));
  for (index_t c = 0; c < sh.cg(); ++c)
    for (index_t i = 0; i < sh.h; ++i)
      std::memcpy(xp + (c * hp + sh.ph + i) * wp + sh.pw, x + (c * sh.h + i) * sh.w, sizeof(T) * sh.w);
}

// Whether the filter reaches outside the image (only with padding): then the planes are copied padded.
inline bool needs_padding(const ConvShape& sh) { return padded_h(sh) != sh.h || padded_w(sh) != sh.w; }

template <typename T>
struct ImplicitB {
  const ConvShape* sh;
  const T* xp;   // the image-group's planes, zero-padded (pad_planes) unless the filter stays inside
  index_t hp, wp;
};

// n contiguous elements as fixed-size copies (64 bytes at a time, then 32, 16, 8, 4): vector moves where
// a copy of run-time size would be a call to memcpy. The same n for every row of a panel, so the
// branches go the same way each time.
template <typename T>
inline void copy_run(T* d, const T* s, index_t n) {
  constexpr index_t CH = kCopyChunk<T>;
  index_t l = 0;
  for (; l + CH <= n; l += CH) std::memcpy(d + l, s + l, sizeof(T) * CH);
  for (index_t part = CH / 2; part >= 1; part /= 2)
    if (n & part) {
      std::memcpy(d + l, s + l, sizeof(T) * part);
      l += part;
    }
}

// One B panel: dst[p*nr + l] = col(pc + p, j + l) for l < n_t, 0 beyond. Row c*R*S + r*S + s of col,
// column p*Q + q (an output pixel), is xp[c, p*sh + r*dh, q*sw + s*dw]: a fixed offset per row plus a
// fixed offset per column. The columns form runs along output rows (merged when one continues the
// other in xp, as a 1x1 layer's rows do); each run is copied down all kc rows in one tight loop, so
// that many independent loads are in flight (the rows lie in different planes).
template <typename T>
void pack_b_im2col(const void* ctx, index_t pc, index_t kc, index_t j, index_t n_t, int nr, T* dst) {
  const ImplicitB<T>& b = *static_cast<const ImplicitB<T>*>(ctx);
  const ConvShape& sh = *b.sh;
  const index_t Q = sh.q, R = sh.r, S = sh.s, wp = b.wp, plane = b.hp * b.wp, sw = sh.sw;
  index_t run_l0[kMaxPanelCols + 1], run_off[kMaxPanelCols];  // run u: columns [run_l0[u], run_l0[u+1])
  int nruns = 0;
  {
    index_t p = j / Q, q = j % Q;
    for (index_t l = 0; l < n_t; ++p, q = 0) {
      const index_t off = p * sh.sh * wp + q * sw;
      const bool continues = nruns > 0 && sw == 1 && run_off[nruns - 1] + (l - run_l0[nruns - 1]) == off;
      if (!continues) {
        run_l0[nruns] = l;
        run_off[nruns++] = off;
      }
      l += std::min<index_t>(n_t - l, Q - q);
    }
    run_l0[nruns] = n_t;
  }
  for (index_t k0 = 0; k0 < kc; k0 += kRowBlock) {
    const index_t k1 = std::min(kc, k0 + kRowBlock);
    index_t row_off[kRowBlock];  // offset of col row pc + kk in xp
    {
      const index_t crs = pc + k0;
      index_t c = crs / (R * S), r = (crs / S) % R, s = crs % S;
      for (index_t kk = k0; kk < k1; ++kk) {
        row_off[kk - k0] = c * plane + r * sh.dh * wp + s * sh.dw;
        if (++s == S) {
          s = 0;
          if (++r == R) {
            r = 0;
            ++c;
          }
        }
      }
    }
    for (int u = 0; u < nruns; ++u) {
      const index_t l0 = run_l0[u], len = run_l0[u + 1] - l0;
      const T* base = b.xp + run_off[u];
      T* d0 = dst + l0;
      if (sw == 1) {
        for (index_t kk = k0; kk < k1; ++kk) copy_run(d0 + kk * nr, base + row_off[kk - k0], len);
      } else if (sw == 2) {
        for (index_t kk = k0; kk < k1; ++kk) copy_stride2(d0 + kk * nr, base + row_off[kk - k0], len);
      } else {
        for (index_t kk = k0; kk < k1; ++kk) {
          const T* sp = base + row_off[kk - k0];
          T* d = d0 + kk * nr;
          for (index_t l = 0; l < len; ++l) d[l] = sp[l * sw];
        }
      }
    }
    if (n_t < nr)
      for (index_t kk = k0; kk < k1; ++kk)
        for (index_t l = n_t; l < nr; ++l) dst[kk * nr + l] = T(0);
  }
}

}  // namespace

namespace {

// The workspace: the filters of every group packed as the GEMM's A (64-byte aligned), then one padded
// copy of an image-group per thread when the convolution pads.
template <typename T>
struct ImplicitWorkspace {
  index_t filter_elems;  // one group's packed filters
  index_t plane_elems;   // one padded copy (0 without padding)
  static constexpr index_t kAlign = 64 / sizeof(T);
  explicit ImplicitWorkspace(const ConvShape& sh)
      : filter_elems(round_up(packed_a_blocks_elems<T>(sh.kg(), sh.crs()), kAlign)),
        plane_elems(needs_padding(sh) ? padded_elems(sh) : 0) {}
  index_t filters(index_t groups) const { return kAlign + groups * filter_elems; }
  index_t elems(index_t groups, int nthreads) const { return filters(groups) + std::max(1, nthreads) * plane_elems; }
};

}  // namespace

template <typename T>
index_t implicit_workspace_elems(const ConvShape& sh, int nthreads) {
  return ImplicitWorkspace<T>(sh).elems(sh.g, nthreads);
}

template <typename T>
void conv2d_fwd_implicit(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y, T* ws, index_t ws_elems) {
  const index_t Kg = sh.kg(), CRS = sh.crs(), PQ = sh.pq(), HW = sh.h * sh.w;
  if (sh.n == 0 || sh.k == 0 || PQ == 0) return;
  if (select_ukernel<T>(active_isa()).nr > kMaxPanelCols)
    throw std::logic_error("conv2d implicit_gemm: the micro-kernel's NR exceeds the packer's panel width");
  const ImplicitWorkspace<T> layout(sh);
  if (ws_elems < layout.elems(sh.g, 1)) throw std::invalid_argument("conv2d implicit_gemm: workspace too small");
  const bool pad = layout.plane_elems > 0;
  const index_t hp = padded_h(sh), wp = padded_w(sh);
  // As many threads as the workspace has padded copies for (at least one).
  const int nt = pad ? static_cast<int>(std::max<index_t>(
                           1, std::min<index_t>(get_num_threads(),
                                                (ws_elems - layout.filters(sh.g)) / layout.plane_elems)))
                     : get_num_threads();
  // The filters packed once for all products (the GEMM would pack them again for every image).
  const index_t misalign = static_cast<index_t>(reinterpret_cast<std::uintptr_t>(ws) % 64 / sizeof(T));
  T* const filters = ws + (misalign ? ImplicitWorkspace<T>::kAlign - misalign : 0);
  T* const planes = filters + sh.g * layout.filter_elems;
  if (CRS > 0)
    for (index_t g = 0; g < sh.g; ++g)
      pack_a_blocks<T>(Kg, CRS, w + g * Kg * CRS, CRS, 1, filters + g * layout.filter_elems);

  // Y[n, g] := W_g @ col(x[n, g]) + bias on `nthreads` threads; with padding, x[n, g] padded into xp first.
  auto product = [&](index_t task, int nthreads, T* xp) {
    const index_t n = task / sh.g, g = task % sh.g;
    const T* xg = x + (n * sh.c + g * sh.cg()) * HW;
    if (pad) pad_planes<T>(sh, xg, xp);
    const ImplicitB<T> ctx = pad ? ImplicitB<T>{&sh, xp, hp, wp} : ImplicitB<T>{&sh, xg, sh.h, sh.w};
    GemmArgs<T> a = strided_gemm_args<T>(Kg, PQ, CRS, w + g * Kg * CRS, CRS, 1, static_cast<const T*>(nullptr), 0,
                                         0, y + (n * sh.k + g * Kg) * PQ, PQ, T(0));
    a.a_packed = filters + g * layout.filter_elems;
    a.pack_b = pack_b_im2col<T>;
    a.pack_b_ctx = &ctx;
    a.bias = bias ? bias + g * Kg : nullptr;
    a.bias_per_row = true;
    gemm<T>(a, nthreads);
  };

  const index_t tasks = sh.n * sh.g;
  const index_t shared = nt > 1 ? tasks / nt * nt : 0;  // products run one per thread
  if (shared > 0) {
    RegionErrors errors;  // the GEMM's packing buffers could not be allocated: rethrown after the region
#pragma omp parallel num_threads(nt)
    {
      const int tid = thread_id();
      for (index_t t = tid; t < shared && !errors.failed(); t += nt)
        errors.run([&] { product(t, 1, planes + tid * layout.plane_elems); });
    }
    errors.rethrow();
  }
  for (index_t t = shared; t < tasks; ++t) product(t, nt, planes);
}

template index_t implicit_workspace_elems<float>(const ConvShape&, int);
template index_t implicit_workspace_elems<double>(const ConvShape&, int);
template void conv2d_fwd_implicit<float>(const ConvShape&, const float*, const float*, const float*, float*, float*,
                                         index_t);
template void conv2d_fwd_implicit<double>(const ConvShape&, const double*, const double*, const double*, double*, double*,
                                          index_t);

// ---- the kernel table (kernels.h): chunk is the threads (one padded image-group copy each).
namespace {
index_t implicit_workspace(const ConvShape& sh, index_t threads, index_t itemsize) {
  return itemsize == 4 ? implicit_workspace_elems<float>(sh, static_cast<int>(threads))
                       : implicit_workspace_elems<double>(sh, static_cast<int>(threads));
}
template <typename T>
void implicit_fwd(const ConvShape& sh, const ConvCall& c) {
  conv2d_fwd_implicit<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<const T*>(c.bias),
                         static_cast<T*>(c.out), static_cast<T*>(c.ws), c.ws_elems);
}
CONV_KERNEL("fwd", "implicit_gemm", nullptr, implicit_workspace, CONV_RUNS(implicit_fwd));
}  // namespace

}  // namespace dnnkit
