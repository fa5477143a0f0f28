// Direct convolution: no workspace, every shape. The forward pass keeps a KB x kQB block of outputs in
// registers over the whole reduction, reading padded input rows split into stride phases; the backward
// data at unit stride is that forward pass over dy with the filters turned (at other strides a loop along
// an output row with the padding bounds hoisted out); the backward filter sums a filter's taps in vector
// accumulators over padded input rows split into stride phases.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../cpu_info.h"
#include "../simd/vec.h"
#include "../work_share.h"
#include "conv.h"
#include "kernels.h"

namespace dnnkit {
namespace {
// Forward: register vectors of output columns in a block of KB output channels: as many as fit the
// register file beside the block's one vector of inputs each and a weight (KB*NV + NV + 1 registers), at
// most 64 bytes' worth twice over.
// (Conditional expressions, not std::min/max: some GCC releases reject those in a variable template.)
template <int KB>
constexpr int kColVecsFit =
    (kVecRegs - 1) / (KB + 1) < 2 * 64 / kRegBytes ? (kVecRegs - 1) / (KB + 1) : 2 * 64 / kRegBytes;
template <int KB>
constexpr int kColVecs = kColVecsFit<KB> > 1 ? kColVecsFit<KB> : 1;
}  // namespace

template <typename T, int KB>
void conv2d_fwd_direct_kb(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y) {
  // Register blocking: an accumulator block of KB output channels x kQB output columns of one output
  // row stays in registers across the whole (c, r, s) reduction; each step loads one kQB-wide input
  // row segment and KB weights, and does KB x kQB multiply-adds.
  using V = reg_vec_t<T>;
  constexpr int L = RegVec<T>::lanes;  // lanes per vector
  constexpr int NV = kColVecs<KB>;     // vectors per accumulator row
  constexpr index_t kQB = NV * L;      // output columns per block
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s, P = sh.p, Q = sh.q, H = sh.h, W = sh.w;
  const index_t kblocks = ceil_div(Kg, KB), qblocks = ceil_div(Q, kQB);
  // Zero-padded copies of the input rows an output row reads, each split into sw phases (sw the stride
  // along the row): element u of row (c, r), x[.., c, ih(r), u - pw] (0 outside the image), lies at
  // pad[(c*nr + r - r_lo)*sw*plen + (u % sw)*plen + u / sw]. Tap s of output column q reads u = q*sw +
  // s*dw: phase (s*dw) % sw, index q + (s*dw) / sw, so each step reads its kQB inputs contiguously
  // with no edge cases, at any stride. Made once a task, read by every block of it. Each phase of a row
  // starts on a vector boundary (plen a multiple of L, the buffer aligned): a tap at index 0 reads whole
  // vectors, never a pair of cache lines for one.
  const index_t sw = sh.sw, plen = round_up(qblocks * kQB + (S - 1) * sh.dw / sw, L), row_len = sw * plen;
  std::vector<index_t> tap(static_cast<std::size_t>(S));  // tap s's window in a row: phase and index
  for (index_t s = 0; s < S; ++s) tap[s] = (s * sh.dw) % sw * plen + s * sh.dw / sw;
  const index_t tasks = sh.n * sh.g * P;
  RegionErrors errors;  // a task's buffers could not be allocated: rethrown after the region
#pragma omp parallel num_threads(get_num_threads()) if (tasks > 1)
  {
    AlignedBuffer<T> pad;
    std::vector<index_t> toff;  // tap (r - r_lo, s)'s window in a channel's padded rows
#pragma omp for schedule(dynamic, 2)
    for (index_t t = 0; t < tasks; ++t) errors.run([&] {
      const index_t p = t % P, g = (t / P) % sh.g, n = t / (P * sh.g);
      const T* xn = x + (n * sh.c + g * Cg) * H * W;
      index_t r_lo = 0, r_hi = R;  // filter rows that land inside the image for this output row
      while (r_lo < R && p * sh.sh - sh.ph + r_lo * sh.dh < 0) ++r_lo;
      while (r_hi > r_lo && p * sh.sh - sh.ph + (r_hi - 1) * sh.dh >= H) --r_hi;
      const index_t nr = r_hi - r_lo;
      const std::size_t pad_len = static_cast<std::size_t>(std::max<index_t>(1, Cg * nr * row_len));
      pad.resize(pad_len);
      std::fill_n(pad.data(), pad_len, T(0));
      const index_t u_lo = std::min(row_len, sh.pw), u_hi = std::min(row_len, sh.pw + W);  // u - pw in [0, W)
      for (index_t c = 0; c < Cg; ++c)
        for (index_t r = r_lo; r < r_hi; ++r) {
          const T* xr = xn + (c * H + p * sh.sh - sh.ph + r * sh.dh) * W;  // element u is xr[u - pw]
          T* row = pad.data() + (c * nr + r - r_lo) * row_len;
          if (sw == 1) {
            std::copy(xr + (u_lo - sh.pw), xr + (u_hi - sh.pw), row + u_lo);
          } else {
            for (index_t u = u_lo; u < u_hi; ++u) row[(u % sw) * plen + u / sw] = xr[u - sh.pw];
          }
        }
      toff.resize(static_cast<std::size_t>(std::max<index_t>(1, nr * S)));
      for (index_t r = 0; r < nr; ++r)
        for (index_t s = 0; s < S; ++s) toff[r * S + s] = r * row_len + tap[s];
      for (index_t kb = 0; kb < kblocks; ++kb) {
        const index_t k0 = g * Kg + kb * KB, kn = std::min<index_t>(KB, Kg - kb * KB);
        for (index_t qb = 0; qb < qblocks; ++qb) {
          const index_t q0 = qb * kQB, qn = std::min(kQB, Q - q0);
          V acc[KB][NV];
          // Row i of the block's weights at wr + woff[i]: rows past kn repeat the last (their sums are
          // never stored), so the inner loop has no branch.
          index_t woff[KB];
#pragma GCC unroll 8
          for (int i = 0; i < KB; ++i) {
            woff[i] = std::min<index_t>(i, kn - 1) * Cg * R * S;
            const T b = (bias && i < kn) ? bias[k0 + i] : T(0);
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[i][v] = splat<V>(b);
          }
          // One tap: kQB inputs from src, the weight of block row i at wt[woff[i]].
          const auto tap_step = [&](const T* src, const T* wt) {
            V x_[NV];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) std::memcpy(&x_[v], src + v * L, sizeof(V));
#pragma GCC unroll 8
            for (int i = 0; i < KB; ++i) {
              const V wi = splat<V>(wt[woff[i]]);
#pragma GCC unroll 8
              for (int v = 0; v < NV; ++v) acc[i][v] += x_[v] * wi;
            }
          };
          if (R == 1 && S == 1) {
            // A 1 x 1 filter: one loop over the input channels (nr is 0 or 1), w[k0 + i, c] = wr[woff[i] + c].
            const T* row = pad.data() + q0 + tap[0];
            const T* wr = w + k0 * Cg;
            for (index_t c = 0; c < Cg * nr; ++c, row += row_len) tap_step(row, wr + c);
          } else {
            // Channel by channel, its taps (rows r_lo.. of the window, S each) in one loop: tap t's inputs
            // at toff[t] in the channel's padded rows, its weight at r_lo*S + t in the channel's filter.
            const T* rowc = pad.data() + q0;
            const T* wc = w + (k0 * Cg * R + r_lo) * S;
            const index_t nt = nr * S;
            for (index_t c = 0; c < Cg; ++c, rowc += nr * row_len, wc += R * S)
              for (index_t t = 0; t < nt; ++t) tap_step(rowc + toff[t], wc + t);
          }
          for (index_t i = 0; i < kn; ++i) {
            T* yr = y + ((n * sh.k + k0 + i) * P + p) * Q + q0;
            alignas(64) T out[kQB];
            std::memcpy(out, acc[i], sizeof(V) * NV);
            std::copy(out, out + qn, yr);
          }
        }
      }
    });
  }
  errors.rethrow();
}

template <typename T>
void conv2d_fwd_direct(const ConvShape& sh, const T* x, const T* w, const T* bias, T* y) {
  // The tallest block a group's output channels fill: depthwise (one channel per group) gets KB = 1
  // instead of computing 7 rows of zeros. 8 channels where the registers hold 8 rows of two vectors.
  if (sh.kg() >= 8 && kColVecs<8> >= 2)
    conv2d_fwd_direct_kb<T, 8>(sh, x, w, bias, y);
  else if (sh.kg() >= 4)
    conv2d_fwd_direct_kb<T, 4>(sh, x, w, bias, y);
  else
    conv2d_fwd_direct_kb<T, 1>(sh, x, w, bias, y);
}

namespace {
// One stride phase of the backward data along one axis (undilated filter): the outputs i = f + stride*a,
// a in [0, count), take the taps r = r0 + stride*m, m in [0, taps), from dy rows a + base - m; as a forward
// correlation over those taps turned around, its padding is taps - 1 - base.
struct Phase {
  index_t count, r0, taps, pad;
};

Phase phase_of(index_t f, index_t stride, index_t pad, index_t size, index_t out) {
  Phase ph{};
  ph.count = f < out ? ceil_div(out - f, stride) : 0;
  ph.r0 = (f + pad) % stride;
  ph.taps = ph.r0 < size ? (size - 1 - ph.r0) / stride + 1 : 0;
  ph.pad = ph.taps - 1 - (f + pad - ph.r0) / stride;
  return ph;
}

// Filter taps r = r0 + step*m, m in [0, taps), along one axis.
struct Taps {
  index_t r0, taps, step;
};

// The forward filters of a backward-data pass over dy: wf[g*Cg + c][k][j][l] = w[g*Kg + k][c][r][s] for the
// taps along each axis turned around (j counts down from r's last), a group's two channel axes swapped.
template <typename T>
void turned_filters(const ConvShape& sh, const T* w, Taps a, Taps b, std::vector<T>& wf) {
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s;
  wf.resize(static_cast<std::size_t>(sh.k * Cg * a.taps * b.taps));
  for (index_t g = 0; g < sh.g; ++g)
    for (index_t c = 0; c < Cg; ++c)
      for (index_t k = 0; k < Kg; ++k)
        for (index_t j = 0; j < a.taps; ++j)
          for (index_t l = 0; l < b.taps; ++l) {
            const index_t r = a.r0 + (a.taps - 1 - j) * a.step, s = b.r0 + (b.taps - 1 - l) * b.step;
            wf[(((g * Cg + c) * Kg + k) * a.taps + j) * b.taps + l] = w[(((g * Kg + k) * Cg + c) * R + r) * S + s];
          }
}

// The backward data at any stride, undilated, as sh*sw forward correlations, one a stride phase of dx,
// each over the taps that reach it (turned around, a group's channel axes swapped) into a buffer then
// spread into dx. False (nothing written) where a phase would need a negative padding.
template <typename T>
bool bwd_data_by_phases(const ConvShape& sh, const T* w, const T* dy, T* dx) {
  const index_t R = sh.r, S = sh.s, H = sh.h, W = sh.w;
  for (index_t fh = 0; fh < sh.sh; ++fh)
    for (index_t fw = 0; fw < sh.sw; ++fw) {
      const Phase a = phase_of(fh, sh.sh, sh.ph, R, H), b = phase_of(fw, sh.sw, sh.pw, S, W);
      if (a.count && b.count && a.taps && b.taps && (a.pad < 0 || b.pad < 0)) return false;
    }
  std::vector<T> out, wf;
  for (index_t fh = 0; fh < sh.sh; ++fh)
    for (index_t fw = 0; fw < sh.sw; ++fw) {
      const Phase a = phase_of(fh, sh.sh, sh.ph, R, H), b = phase_of(fw, sh.sw, sh.pw, S, W);
      if (!a.count || !b.count) continue;
      const index_t planes = sh.n * sh.c, plane = a.count * b.count;
      const bool empty = !a.taps || !b.taps;
      if (!empty) {
        ConvShape f = sh;
        f.c = sh.k, f.h = sh.p, f.w = sh.q, f.k = sh.c, f.r = a.taps, f.s = b.taps, f.p = a.count, f.q = b.count;
        f.sh = f.sw = 1, f.ph = a.pad, f.pw = b.pad;
        turned_filters(sh, w, {a.r0, a.taps, sh.sh}, {b.r0, b.taps, sh.sw}, wf);
        out.resize(static_cast<std::size_t>(planes * plane));
        conv2d_fwd_direct(f, dy, wf.data(), static_cast<const T*>(nullptr), out.data());
      }
#pragma omp parallel for num_threads(get_num_threads()) if (planes > 1)
      for (index_t t = 0; t < planes; ++t) {
        T* d = dx + t * H * W + fh * W + fw;
        for (index_t i = 0; i < a.count; ++i)
          for (index_t j = 0; j < b.count; ++j)
            d[i * sh.sh * W + j * sh.sw] = empty ? T(0) : out[static_cast<std::size_t>(t * plane + i * b.count + j)];
      }
    }
  return true;
}
}  // namespace

template <typename T>
void conv2d_bwd_data_direct(const ConvShape& sh, const T* w, const T* dy, T* dx) {
  // dx[n, c, ih, iw] = sum_{k in group, r, s, p, q : ih = p*sh - ph + r*dh, iw = q*sw - pw + s*dw} w * dy
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s, P = sh.p, Q = sh.q, H = sh.h, W = sh.w;
  if (sh.sh == 1 && sh.sw == 1 && sh.ph <= (R - 1) * sh.dh && sh.pw <= (S - 1) * sh.dw) {
    // At unit stride this is the forward correlation of dy with each filter turned 180 degrees and a
    // group's two channel axes swapped, padded by dilation * (size - 1) - padding: dx row ih reads dy rows
    // ih + ph - r*dh. The forward's register blocks do it.
    ConvShape f = sh;
    f.c = sh.k, f.h = P, f.w = Q, f.k = sh.c, f.p = H, f.q = W;
    f.ph = (R - 1) * sh.dh - sh.ph, f.pw = (S - 1) * sh.dw - sh.pw;
    std::vector<T> wf;
    turned_filters(sh, w, {0, R, 1}, {0, S, 1}, wf);
    conv2d_fwd_direct(f, dy, wf.data(), static_cast<const T*>(nullptr), dx);
    return;
  }
  if (sh.dh == 1 && sh.dw == 1 && bwd_data_by_phases(sh, w, dy, dx)) return;
  const index_t tasks = sh.n * sh.c;
#pragma omp parallel for schedule(dynamic) num_threads(get_num_threads()) if (tasks > 1)
  for (index_t t = 0; t < tasks; ++t) {
    const index_t n = t / sh.c, ci = t % sh.c, g = ci / Cg, c = ci % Cg;
    T* dxc = dx + (n * sh.c + ci) * H * W;
    std::fill(dxc, dxc + H * W, T(0));
    for (index_t kk = 0; kk < Kg; ++kk) {
      const index_t k = g * Kg + kk;
      const T* dyk = dy + (n * sh.k + k) * P * Q;
      for (index_t r = 0; r < R; ++r) {
        index_t p_lo, p_hi;
        valid_range(P, H, sh.sh, sh.ph, r * sh.dh, &p_lo, &p_hi);
        for (index_t s = 0; s < S; ++s) {
          index_t q_lo, q_hi;
          valid_range(Q, W, sh.sw, sh.pw, s * sh.dw, &q_lo, &q_hi);
          const T wv = w[((k * Cg + c) * R + r) * S + s];
          for (index_t p = p_lo; p < p_hi; ++p) {
            T* xr = dxc + (p * sh.sh - sh.ph + r * sh.dh) * W - sh.pw + s * sh.dw;
            const T* dyr = dyk + p * Q;
            if (sh.sw == 1) {
#pragma omp simd
              for (index_t q = q_lo; q < q_hi; ++q) xr[q] += wv * dyr[q];
            } else {
              for (index_t q = q_lo; q < q_hi; ++q) xr[q * sh.sw] += wv * dyr[q];
            }
          }
        }
      }
    }
  }
}

namespace {
// Backward filter, unit stride along the row: the sums of NT taps of KK filters (output channels, cs
// apart in dy, ss apart in sums) at once, over one image's output rows. xp is the zero-padded input plane
// (row stride wp), off[t] tap t's offset in it from an output position's window; every row is read as
// whole vectors, the last one's dy lanes past Q zero. In registers: the KK*NT accumulators, and per step
// one dy vector and an x vector a tap (one filter: the x vectors one at a time; several: the NT x vectors
// of the step, then a dy vector a filter). The vector sums are added into sums.
template <typename T, int KK, int NT>
void filter_taps(const T* xp, index_t row_step, const index_t* off, const T* dyk, index_t cs, index_t P, index_t Q,
                 T* sums, index_t ss) {
  using V = reg_vec_t<T>;
  constexpr index_t L = RegVec<T>::lanes;
  V acc[KK][NT];
#pragma GCC unroll 16
  for (int c = 0; c < KK; ++c)
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) acc[c][t] = V{};
  // dy[q, q + L) of a row; on the row's last, partial vector (kTail) its lanes past Q zero.
  auto load_dy = [Q](const T* row, index_t q, auto tail) {
    V d;
    if constexpr (decltype(tail)::value) {
      alignas(64) T lanes[L] = {};
      copy_lanes<T, L>(lanes, row + q, static_cast<int>(Q - q));  // Q - q < L values, no call
      std::memcpy(&d, lanes, sizeof(V));
    } else {
      std::memcpy(&d, row + q, sizeof(V));
    }
    return d;
  };
  auto step = [&](const T* const* xt, const T* dyr, index_t q, auto tail) {
    if constexpr (KK == 1) {
      const V d = load_dy(dyr, q, tail);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
        V xv;
        std::memcpy(&xv, xt[t] + q, sizeof(V));
        acc[0][t] += d * xv;
      }
    } else {
      V xv[NT];
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) std::memcpy(&xv[t], xt[t] + q, sizeof(V));
#pragma GCC unroll 16
      for (int c = 0; c < KK; ++c) {
        const V d = load_dy(dyr + c * cs, q, tail);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) acc[c][t] += d * xv[t];
      }
    }
  };
  for (index_t p = 0; p < P; ++p) {
    const T* xt[NT];  // tap t's window of this row
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) xt[t] = xp + p * row_step + off[t];
    const T* dyr = dyk + p * Q;
    index_t q = 0;
    for (; q + L <= Q; q += L) step(xt, dyr, q, std::false_type{});
    if (q < Q) step(xt, dyr, q, std::true_type{});
  }
  for (int c = 0; c < KK; ++c)
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      T sum = T(0);
      for (index_t l = 0; l < L; ++l) sum += acc[c][t][l];
      sums[c * ss + t] += sum;
    }
}

// Taps a block of one filter: its accumulators and two vectors within the register file, at most 9 (a
// 3 x 3 filter in one pass).
constexpr int kTapBlock = std::min(9, kVecRegs - 2);
// Filters a block of a filter with NT <= 3 taps: KK*NT accumulators, NT x vectors and a dy vector within
// the register file, so that enough independent sums hide the multiply-add latency.
template <int NT>
constexpr int kFilterBlock = (kVecRegs - 1 - NT) / NT < 8 ? (kVecRegs - 1 - NT) / NT : 8;

template <typename T, int NT = kTapBlock>
void filter_taps_n(int nt, const T* xp, index_t row_step, const index_t* off, const T* dyk, index_t P, index_t Q,
                   T* sums) {
  if constexpr (NT > 1) {
    if (nt < NT) return filter_taps_n<T, NT - 1>(nt, xp, row_step, off, dyk, P, Q, sums);
  }
  filter_taps<T, 1, NT>(xp, row_step, off, dyk, 0, P, Q, sums, 0);
}

// Filters [0, kn) of a task, taps (all of them) each: blocks of kFilterBlock filters where a filter has
// at most 3 taps, else one filter at a time in blocks of taps. dyk is filter 0's, cs apart; sums taps
// apart.
template <typename T, int NT = 3>
void filter_block(index_t kn, index_t taps, const T* xp, index_t row_step, const index_t* off, const T* dyk,
                  index_t cs, index_t P, index_t Q, T* sums) {
  if constexpr (NT > 1) {
    if (taps < NT) return filter_block<T, NT - 1>(kn, taps, xp, row_step, off, dyk, cs, P, Q, sums);
  }
  constexpr int KK = kFilterBlock<NT>;
  index_t k = 0;
  if (taps == NT)
    for (; k + KK <= kn; k += KK)
      filter_taps<T, KK, NT>(xp, row_step, off, dyk + k * cs, cs, P, Q, sums + k * taps, taps);
  for (; k < kn; ++k)
    for (index_t t0 = 0; t0 < taps; t0 += kTapBlock) {
      const int nt = static_cast<int>(std::min<index_t>(kTapBlock, taps - t0));
      filter_taps_n<T>(nt, xp, row_step, off + t0, dyk + k * cs, P, Q, sums + k * taps + t0);
    }
}

// Output channels a task: one padded input plane an image is read by all of them.
constexpr index_t kFilterChunk = 16;

template <typename T>
void bwd_filter_vectors(const ConvShape& sh, const T* x, const T* dy, T* dw) {
  constexpr index_t L = RegVec<T>::lanes;
  const index_t Kg = sh.kg(), Cg = sh.cg(), R = sh.r, S = sh.s, P = sh.p, Q = sh.q, H = sh.h, W = sh.w;
  const index_t taps = R * S, sw = sh.sw;
  // The padded plane, each row split into sw phases: element v of padded row u, x[n, ci, u - ph, v - pw]
  // (0 outside the image), lies at xp[u*row_len + (v % sw)*plen + v / sw]. Tap (r, s) of output (p, q)
  // reads v = q*sw + s*dw: phase (s*dw) % sw, index q + (s*dw) / sw, so a tap's inputs for a vector of
  // outputs are contiguous at any stride. Rows cover every output row's window; phases whole vectors.
  const index_t hp = (P - 1) * sh.sh + (R - 1) * sh.dh + 1;
  const index_t plen = round_up(Q, L) + (S - 1) * sh.dw / sw, row_len = sw * plen;
  std::vector<index_t> off(static_cast<std::size_t>(taps));
  for (index_t r = 0; r < R; ++r)
    for (index_t s = 0; s < S; ++s)
      off[r * S + s] = r * sh.dh * row_len + (s * sh.dw) % sw * plen + s * sh.dw / sw;
  // Only the rows and phases some tap reads are filled (a 1 x 1 filter at stride 2 reads a quarter).
  std::vector<char> row_read(static_cast<std::size_t>(hp), 0), phase_read(static_cast<std::size_t>(sw), 0);
  for (index_t p = 0; p < P; ++p)
    for (index_t r = 0; r < R; ++r) row_read[p * sh.sh + r * sh.dh] = 1;
  for (index_t s = 0; s < S; ++s) phase_read[(s * sh.dw) % sw] = 1;
  // Task order: an input channel's chunks in turn (x read from memory once, all of dy once a channel)
  // where dy fits in half the L3 and has few chunks; else a chunk of filters for every input channel in
  // turn (x read once a chunk, the chunk's dy staying in the cache): no order streams all of dy from
  // memory once a channel, and many chunks (256 and more filters a group) reread x less than dy.
  const index_t chunks = ceil_div(Kg, kFilterChunk), tasks = sh.c * chunks;
  const bool channel_major =
      chunks < 16 && sh.n * sh.k * P * Q * static_cast<index_t>(sizeof(T)) <= l3_cache_bytes() / 2;
  RegionErrors errors;  // a thread's buffers could not be allocated: rethrown after the region
#pragma omp parallel num_threads(get_num_threads()) if (tasks > 1)
  {
    std::vector<T> xp, sums;
    errors.run([&] {
      xp.assign(static_cast<std::size_t>(hp * row_len), T(0));
      sums.resize(static_cast<std::size_t>(kFilterChunk * taps));
    });
#pragma omp for schedule(dynamic)
    for (index_t t = 0; t < tasks; ++t) {
      if (errors.failed()) continue;
      const index_t ci = channel_major ? t / chunks : t % sh.c, chunk = channel_major ? t % chunks : t / sh.c;
      const index_t g = ci / Cg, c = ci % Cg;
      const index_t k0 = g * Kg + chunk * kFilterChunk, kn = std::min(kFilterChunk, g * Kg + Kg - k0);
      std::fill(sums.begin(), sums.end(), T(0));
      for (index_t n = 0; n < sh.n; ++n) {
        const T* xc = x + (n * sh.c + ci) * H * W;
        for (index_t u = 0; u < hp; ++u) {
          if (!row_read[u]) continue;
          const index_t ih = u - sh.ph;
          for (index_t f = 0; f < sw; ++f) {
            if (!phase_read[f]) continue;
            T* row = xp.data() + u * row_len + f * plen;
            if (ih < 0 || ih >= H) {
              std::fill(row, row + plen, T(0));
              continue;
            }
            // index i holds v = i*sw + f, inside the image for v - pw in [0, W)
            const T* xr = xc + ih * W;
            const index_t i_lo = std::min(plen, ceil_div(std::max<index_t>(0, sh.pw - f), sw));
            const index_t i_hi = std::max(i_lo, std::min(plen, ceil_div(std::max<index_t>(0, sh.pw + W - f), sw)));
            std::fill(row, row + i_lo, T(0));
            if (sw == 1) {
              std::copy(xr + (i_lo - sh.pw), xr + (i_hi - sh.pw), row + i_lo);
            } else {
              for (index_t i = i_lo; i < i_hi; ++i) row[i] = xr[i * sw + f - sh.pw];
            }
            std::fill(row + i_hi, row + plen, T(0));
          }
        }
        filter_block<T>(kn, taps, xp.data(), sh.sh * row_len, off.data(), dy + (n * sh.k + k0) * P * Q, P * Q, P, Q,
                        sums.data());
      }
      for (index_t kk = 0; kk < kn; ++kk)
        std::copy(sums.data() + kk * taps, sums.data() + (kk + 1) * taps, dw + ((k0 + kk) * Cg + c) * taps);
    }
  }
  errors.rethrow();
}
}  // namespace

template <typename T>
void conv2d_bwd_filter_direct(const ConvShape& sh, const T* x, const T* dy, T* dw) {
  // dw[k, c, r, s] = sum_{n, p, q} dy[n, k, p, q] * x[n, g*Cg + c, p*sh - ph + r*dh, q*sw - pw + s*dw]
  if (sh.p == 0 || sh.q == 0) {
    std::fill(dw, dw + sh.k * sh.crs(), T(0));
    return;
  }
  if (sh.is_pointwise()) {  // each plane of x and dy as one row: whole vectors, one sum a plane
    ConvShape f = sh;
    f.h = f.p = 1, f.w = f.q = sh.p * sh.q;
    return bwd_filter_vectors<T>(f, x, dy, dw);
  }
  bwd_filter_vectors<T>(sh, x, dy, dw);
}

#define DNNKIT_INSTANTIATE(T)                                                                  \
  template void conv2d_fwd_direct<T>(const ConvShape&, const T*, const T*, const T*, T*);     \
  template void conv2d_bwd_data_direct<T>(const ConvShape&, const T*, const T*, T*);          \
  template void conv2d_bwd_filter_direct<T>(const ConvShape&, const T*, const T*, T*);
DNNKIT_INSTANTIATE(float)
DNNKIT_INSTANTIATE(double)
#undef DNNKIT_INSTANTIATE

// ---- the kernel table (kernels.h): no workspace, every shape.
namespace {
template <typename T>
void direct_fwd(const ConvShape& sh, const ConvCall& c) {
  conv2d_fwd_direct<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<const T*>(c.bias),
                       static_cast<T*>(c.out));
}
template <typename T>
void direct_bwd_data(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_data_direct<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<T*>(c.out));
}
template <typename T>
void direct_bwd_filter(const ConvShape& sh, const ConvCall& c) {
  conv2d_bwd_filter_direct<T>(sh, static_cast<const T*>(c.a0), static_cast<const T*>(c.a1), static_cast<T*>(c.out));
}
CONV_KERNEL("fwd", "direct", nullptr, nullptr, CONV_RUNS(direct_fwd));
CONV_KERNEL("bwd_data", "direct", nullptr, nullptr, CONV_RUNS(direct_bwd_data));
CONV_KERNEL("bwd_filter", "direct", nullptr, nullptr, CONV_RUNS(direct_bwd_filter));
}  // namespace

}  // namespace dnnkit
