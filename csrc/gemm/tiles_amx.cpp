// float32 products on AMX tiles: the split into bfloat16 parts, the packing, the 32 x 32 tile kernel and
// the blocked driver (amx.h says what is computed and why it is accurate). Compiled for AVX-512 with
// AVX512-BF16 and AMX; reached only through amx.cpp's checks that the CPU and the OS run them.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "amx.h"
#include "epilogue.h"

namespace dnnkit {
namespace amx {

// GCC's headers build some conversions on _mm512_undefined_*: not a use of anything uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

// |x|'s bits in [2^-100, 0x1.fefp127) or zero: a - lo >= hi - lo (unsigned) marks the others.
constexpr unsigned kLo = 0x0D800000u, kSpan = 0x7F7F8000u - 0x0D800000u;

inline __mmask16 unsplittable(__m512i bits, __mmask16 valid) {
  const __m512i u = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nonzero = _mm512_mask_test_epi32_mask(valid, u, u);
  return _mm512_mask_cmpge_epu32_mask(nonzero, _mm512_sub_epi32(u, _mm512_set1_epi32(int(kLo))),
                                      _mm512_set1_epi32(int(kSpan)));
}

inline bool unsplittable(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  u &= 0x7fffffffu;
  return u != 0 && u - kLo >= kSpan;
}

inline __mmask16 first(index_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// A run of n contiguous values.
bool run_splittable(const float* x, index_t n) {
  __mmask16 bad = 0;
  index_t i = 0;
  for (; i + 16 <= n; i += 16) bad |= unsplittable(_mm512_loadu_si512(x + i), 0xffff);
  if (i < n) {
    const __mmask16 m = first(n - i);
    bad |= unsplittable(_mm512_maskz_loadu_epi32(m, x + i), m);
  }
  return bad == 0;
}

inline __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// x = p0 + p1 + p2, each part bfloat16 (nearest); exact for splittable x.
inline void split(__m512 x, __m256i& p0, __m256i& p1, __m256i& p2) {
  p0 = (__m256i)_mm512_cvtneps_pbh(x);
  const __m512 r1 = _mm512_sub_ps(x, widen(p0));
  p1 = (__m256i)_mm512_cvtneps_pbh(r1);
  p2 = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(r1, widen(p1)));
}

// 32 consecutive values (v0: 0-15, v1: 16-31) as the three parts' rows of 32 bfloat16 in order, at out,
// out + ps and out + 2 ps. x0 is bfloat16's nearest (in order, from one conversion of both vectors);
// the rest runs on the even and odd elements apart, as float32 whose low 16 bits are zero, so that a
// pair of them is one bfloat16 dword by a shift and a merge: x1 = r1 cut to its top 8 significant
// bits (r1 = x - x0, exact), x2 = r1 - x1 (exact, at most 8 significant bits, so a bfloat16 as it
// stands). |x1| <= |r1| <= 2^-9 |x| and |x2| < 2^-7 |r1| <= 2^-16 |x|: the terms the six products leave
// out stay near 2^-24 |a b|, and x1, x2 carry r1's sign, which x0's nearest rounding leaves unbiased.
// About 16 vector operations for 32 values, against 30 for three conversions to bfloat16 and back.
inline void split_row32(__m512 v0, __m512 v1, bf16* out, index_t ps) {
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i p0 = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);  // dword d: x0[2d] low, x0[2d + 1] high
  const __m512 xe = _mm512_permutex2var_ps(v0, even, v1), xo = _mm512_permutex2var_ps(v0, odd, v1);
  const __m512i r1e = _mm512_castps_si512(_mm512_sub_ps(xe, _mm512_castsi512_ps(_mm512_slli_epi32(p0, 16))));
  const __m512i r1o = _mm512_castps_si512(_mm512_sub_ps(xo, _mm512_castsi512_ps(_mm512_and_si512(p0, hi))));
  // (o & hi) | (e >> 16): 0xEA is A & B | C
  const __m512i p1 = _mm512_ternarylogic_epi32(r1o, hi, _mm512_srli_epi32(r1e, 16), 0xEA);
  const __m512 r2e = _mm512_sub_ps(_mm512_castsi512_ps(r1e), _mm512_castsi512_ps(_mm512_and_si512(r1e, hi)));
  const __m512 r2o = _mm512_sub_ps(_mm512_castsi512_ps(r1o), _mm512_castsi512_ps(_mm512_and_si512(r1o, hi)));
  const __m512i p2 = _mm512_or_si512(_mm512_castps_si512(r2o), _mm512_srli_epi32(_mm512_castps_si512(r2e), 16));
  _mm512_store_si512(out, p0);
  _mm512_store_si512(out + ps, p1);
  _mm512_store_si512(out + 2 * ps, p2);
}

// Two vectors of 16 bfloat16 as 16 dwords: lo in the low halves (the even element of each pair).
inline __m512i pairs(__m256i lo, __m256i hi) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}
// 32 consecutive bfloat16 (two halves of 16) as 16 dwords.
inline __m512i concat(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
}

// r[i] := column i of the 16 x 16 dword matrix whose rows are r[0..15].
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // r[4i + j] now holds, in 128-bit lane L, rows 4i..4i+3 of column 4L + j.
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

inline bf16* part_tile(bf16* step, int part, int half) { return step + (part * 2 + half) * 512; }

// One step of an A panel from rows contiguous in depth (cs == 1): kk <= 32 values of each of `rows` rows.
void a_step_rows(int rows, index_t kk, const float* a, index_t rs, bf16* step) {
  const __mmask16 lo = first(kk), hi = kk > 16 ? first(kk - 16) : 0;
  for (int r = 0; r < 32; ++r) {
    bf16* const out = part_tile(step, 0, r / 16) + (r % 16) * 32;
    if (r < rows) {
      split_row32(_mm512_maskz_loadu_ps(lo, a + r * rs), _mm512_maskz_loadu_ps(hi, a + r * rs + 16), out, 1024);
    } else {
      for (int q = 0; q < 3; ++q) _mm512_store_si512(out + q * 1024, _mm512_setzero_si512());
    }
  }
}

// One step of an A panel from columns contiguous in rows (rs == 1): depth values 2p, 2p + 1 of 16 rows
// at a time, paired, then transposed into rows.
void a_step_cols(int rows, index_t kk, const float* a, index_t cs, bf16* step) {
  for (int half = 0; half < 2; ++half) {
    const int rh = std::clamp(rows - half * 16, 0, 16);
    const __mmask16 m = first(rh);
    __m512i v[3][16];
    for (int p = 0; p < 16; ++p) {
      const index_t d = 2 * p;
      __m256i e[3], o[3];
      split(d < kk ? _mm512_maskz_loadu_ps(m, a + half * 16 + d * cs) : _mm512_setzero_ps(), e[0], e[1], e[2]);
      split(d + 1 < kk ? _mm512_maskz_loadu_ps(m, a + half * 16 + (d + 1) * cs) : _mm512_setzero_ps(), o[0], o[1],
            o[2]);
      for (int q = 0; q < 3; ++q) v[q][p] = pairs(e[q], o[q]);
    }
    for (int q = 0; q < 3; ++q) {
      transpose16(v[q]);
      bf16* t = part_tile(step, q, half);
      for (int r = 0; r < 16; ++r) _mm512_store_si512(t + r * 32, v[q][r]);
    }
  }
}

// One step of a B panel from rows contiguous in columns (cs == 1): rows 2p and 2p + 1 paired.
void b_step_rows(int cols, index_t kk, const float* b, index_t rs, bf16* step) {
  for (int half = 0; half < 2; ++half) {
    const __mmask16 m = first(std::clamp(cols - half * 16, 0, 16));
    for (int p = 0; p < 16; ++p) {
      const index_t d = 2 * p;
      __m256i e[3], o[3];
      split(d < kk ? _mm512_maskz_loadu_ps(m, b + d * rs + half * 16) : _mm512_setzero_ps(), e[0], e[1], e[2]);
      split(d + 1 < kk ? _mm512_maskz_loadu_ps(m, b + (d + 1) * rs + half * 16) : _mm512_setzero_ps(), o[0], o[1],
            o[2]);
      for (int q = 0; q < 3; ++q) _mm512_store_si512(part_tile(step, q, half) + p * 32, pairs(e[q], o[q]));
    }
  }
}

// Steps of several B panels from rows contiguous in columns (cs == 1, a row-major B): rows outermost,
// each pair of rows walked along all n columns, so that B streams in its own order (panel by panel,
// the 32 rows of a step, 4 KiB apart at n = 1024, evict each other from L1 before the next panel reads
// them: 2.6 cycles a value against about 0.5).
void b_steps_rows(index_t k, index_t n, const float* b, index_t rs, bf16* dst, index_t panel_stride) {
  for (index_t s = 0; s < steps(k); ++s) {
    const index_t p0 = s * kStep, kk = std::min<index_t>(kStep, k - p0);
    for (int p = 0; p < 16; ++p) {
      const index_t d = 2 * p;
      const float* r0 = b + (p0 + d) * rs;
      const float* r1 = r0 + rs;
      for (index_t j = 0; j < n; j += 16) {
        const __mmask16 m = first(n - j);
        __m256i e[3], o[3];
        split(d < kk ? _mm512_maskz_loadu_ps(m, r0 + j) : _mm512_setzero_ps(), e[0], e[1], e[2]);
        split(d + 1 < kk ? _mm512_maskz_loadu_ps(m, r1 + j) : _mm512_setzero_ps(), o[0], o[1], o[2]);
        bf16* step = dst + (j / 32) * panel_stride + s * kStepElems;
        const int half = static_cast<int>((j / 16) % 2);
        for (int q = 0; q < 3; ++q) _mm512_store_si512(part_tile(step, q, half) + p * 32, pairs(e[q], o[q]));
      }
      if (n % 32 != 0 && n % 32 <= 16) {  // the last panel's second half: zero columns
        bf16* step = dst + (n / 32) * panel_stride + s * kStepElems;
        for (int q = 0; q < 3; ++q) _mm512_store_si512(part_tile(step, q, 1) + p * 32, _mm512_setzero_si512());
      }
    }
  }
}

// One step of a B panel from columns contiguous in depth (rs == 1, B = W^T): each column's 32 values
// are its 16 pairs already; 16 columns transposed into pair rows.
void b_step_cols(int cols, index_t kk, const float* b, index_t cs, bf16* step) {
  const __mmask16 lo = first(kk), hi = kk > 16 ? first(kk - 16) : 0;
  for (int half = 0; half < 2; ++half) {
    __m512i v[3][16];
    for (int j = 0; j < 16; ++j) {
      const int col = half * 16 + j;
      if (col < cols) {
        __m256i l[3], h[3];
        split(_mm512_maskz_loadu_ps(lo, b + col * cs), l[0], l[1], l[2]);
        split(_mm512_maskz_loadu_ps(hi, b + col * cs + 16), h[0], h[1], h[2]);
        for (int q = 0; q < 3; ++q) v[q][j] = concat(l[q], h[q]);
      } else {
        v[0][j] = v[1][j] = v[2][j] = _mm512_setzero_si512();
      }
    }
    for (int q = 0; q < 3; ++q) {
      transpose16(v[q]);
      bf16* t = part_tile(step, q, half);
      for (int p = 0; p < 16; ++p) _mm512_store_si512(t + p * 32, v[q][p]);
    }
  }
}

// Any other strides: the step's block gathered into a row-major buffer first.
void gather(int lines, index_t kk, const float* x, index_t ls, index_t ds, float* buf) {
  for (int r = 0; r < 32; ++r)
    for (int p = 0; p < 32; ++p) buf[r * 32 + p] = r < lines && p < kk ? x[r * ls + p * ds] : 0.f;
}

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// Tiles 0-3 hold C (0: rows 0-15 x columns 0-15, 1: rows 0-15 x 16-31, 2: rows 16-31 x 0-15, 3: rows
// 16-31 x 16-31); 4 and 5 A's two row tiles of one part, 6 and 7 B's two column tiles of one part. The
// six part products of a step run smallest first, (2,0), (1,0), (1,1), (0,1), (0,0), (0,2), so that each
// part of A is loaded once and each of B once or twice: 14 tile loads for 24 products.
#define DNNKIT_LA(q)                                \
  _tile_loadd(4, sa + ((q) * 2 + 0) * 512, 64); \
  _tile_loadd(5, sa + ((q) * 2 + 1) * 512, 64)
#define DNNKIT_LB(q)                                \
  _tile_loadd(6, sb + ((q) * 2 + 0) * 512, 64); \
  _tile_loadd(7, sb + ((q) * 2 + 1) * 512, 64)
#define DNNKIT_T4            \
  _tile_dpbf16ps(0, 4, 6); \
  _tile_dpbf16ps(1, 4, 7); \
  _tile_dpbf16ps(2, 5, 6); \
  _tile_dpbf16ps(3, 5, 7)

// side() after every four products: work for the vector units while the tile unit runs them.
template <class Side>
inline void run_steps(index_t nsteps, const bf16* a, const bf16* b, Side&& side) {
  for (index_t s = 0; s < nsteps; ++s) {
    const bf16* sa = a + s * kStepElems;
    const bf16* sb = b + s * kStepElems;
    DNNKIT_LA(2);
    DNNKIT_LB(0);
    DNNKIT_T4;
    side();
    DNNKIT_LA(1);
    DNNKIT_T4;
    side();
    DNNKIT_LB(1);
    DNNKIT_T4;
    side();
    DNNKIT_LA(0);
    DNNKIT_T4;
    side();
    DNNKIT_LB(0);
    DNNKIT_T4;
    side();
    DNNKIT_LB(2);
    DNNKIT_T4;
    side();
  }
}
inline void run_steps(index_t nsteps, const bf16* a, const bf16* b) {
  run_steps(nsteps, a, b, [] {});
}

}  // namespace

namespace {
thread_local int t_scopes = 0;  // TileScopes alive on this thread: the outermost loads and releases
}

TileScope::TileScope() {
  if (t_scopes++ > 0) return;
  // Tiles 0-7: 16 rows of 64 bytes. A constant in memory, loaded by an asm whose operand is the whole
  // 64 bytes: GCC 12's _tile_loadconfig names only the first 8, and the stores that fill a stack copy
  // can be dropped as dead.
  static const TileConfig config = [] {
    TileConfig c;
    for (int i = 0; i < 8; ++i) {
      c.rows[i] = 16;
      c.colsb[i] = 64;
    }
    return c;
  }();
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

TileScope::~TileScope() {
  if (--t_scopes == 0) _tile_release();
}

bool splittable(index_t m, index_t n, const float* x, index_t rs, index_t cs) {
  if (m <= 0 || n <= 0) return true;
  if (cs == 1 || rs == 1) {
    const index_t lines = cs == 1 ? m : n, len = cs == 1 ? n : m, ls = cs == 1 ? rs : cs;
    if (ls == len) return run_splittable(x, lines * len);  // one contiguous block
    for (index_t i = 0; i < lines; ++i)
      if (!run_splittable(x + i * ls, len)) return false;
    return true;
  }
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j)
      if (unsplittable(x[i * rs + j * cs])) return false;
  return true;
}

void pack_a_step(int rows, index_t kk, const float* a, index_t rs, bf16* step) { a_step_rows(rows, kk, a, rs, step); }

// step(p0, kk, dst) for each step of 32 in depth of a panel: depth [p0, p0 + kk), written at dst.
template <class Step>
void for_each_step(index_t k, bf16* dst, Step&& step) {
  for (index_t s = 0; s < steps(k); ++s) step(s * kStep, std::min<index_t>(kStep, k - s * kStep), dst + s * kStepElems);
}

void pack_a_panel(int rows, index_t k, const float* a, index_t rs, index_t cs, bf16* dst) {
  alignas(64) float buf[32 * 32];
  for_each_step(k, dst, [&](index_t p0, index_t kk, bf16* step) {
    if (cs == 1) return a_step_rows(rows, kk, a + p0, rs, step);
    if (rs == 1) return a_step_cols(rows, kk, a + p0 * cs, cs, step);
    gather(rows, kk, a + p0 * cs, rs, cs, buf);
    a_step_rows(rows, kk, buf, 32, step);
  });
}

// SplitQueue::run's body, inline in tile_t's loop.
// Splittable: every nonzero |x| (bits u) in [kLo, kLo + kSpan): the smallest u - 1 (a zero wraps to the
// largest) and the largest u over the panels tell.
__attribute__((always_inline)) inline void split_rows(SplitQueue& sq, index_t n) {
  n = std::min(n, sq.left_);
  if (n <= 0) return;
  sq.left_ -= n;
  const __m512i abs = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  __m512i umin = _mm512_load_si512(sq.umin_), umax = _mm512_load_si512(sq.umax_);
  while (n > 0) {
    const SplitQueue::Panel& p = sq.panels_[sq.panel_];
    const index_t p0 = sq.step_ * kStep, kk = std::min<index_t>(kStep, p.k - p0);
    const __mmask16 lo = first(kk), hi = kk > 16 ? first(kk - 16) : 0;
    bf16* const out = p.dst + sq.step_ * kStepElems;
    for (; n > 0 && sq.row_ < kBlock; --n, ++sq.row_) {
      bf16* const o = part_tile(out, 0, static_cast<int>(sq.row_ / 16)) + (sq.row_ % 16) * 32;
      if (sq.row_ >= p.rows) {
        for (int q = 0; q < 3; ++q) _mm512_store_si512(o + q * 1024, _mm512_setzero_si512());
        continue;
      }
      const float* const x = p.a + sq.row_ * p.rs + p0;
      const __m512 v0 = _mm512_maskz_loadu_ps(lo, x), v1 = _mm512_maskz_loadu_ps(hi, x + 16);
      const __m512i u0 = _mm512_and_si512(_mm512_castps_si512(v0), abs);
      const __m512i u1 = _mm512_and_si512(_mm512_castps_si512(v1), abs);
      umin = _mm512_min_epu32(umin, _mm512_min_epu32(_mm512_sub_epi32(u0, one), _mm512_sub_epi32(u1, one)));
      umax = _mm512_max_epu32(umax, _mm512_max_epu32(u0, u1));
      split_row32(v0, v1, o, 1024);
    }
    if (sq.row_ == kBlock) {
      sq.row_ = 0;
      if (++sq.step_ == steps(p.k)) {
        sq.step_ = 0;
        ++sq.panel_;
      }
    }
  }
  _mm512_store_si512(sq.umin_, umin);
  _mm512_store_si512(sq.umax_, umax);
}

void SplitQueue::run(index_t n) { split_rows(*this, n); }

bool SplitQueue::ok() const {
  std::uint32_t lo = ~0u, hi = 0;
  for (int i = 0; i < 16; ++i) {
    lo = std::min(lo, umin_[i]);
    hi = std::max(hi, umax_[i]);
  }
  return lo >= kLo - 1 && hi < kLo + kSpan;
}

void pack_b_panel(index_t k, int cols, const float* b, index_t rs, index_t cs, bf16* dst) {
  alignas(64) float buf[32 * 32];
  for_each_step(k, dst, [&](index_t p0, index_t kk, bf16* step) {
    if (rs == 1) return b_step_cols(cols, kk, b + p0, cs, step);
    if (cs == 1) return b_step_rows(cols, kk, b + p0 * rs, rs, step);
    gather(cols, kk, b + p0 * rs, cs, rs, buf);  // buf[j*32 + p] = B(p0 + p, j): columns contiguous
    b_step_cols(cols, kk, buf, 32, step);
  });
}

void pack_b_panels(index_t k, index_t n, const float* b, index_t rs, index_t cs, bf16* dst, index_t panel_stride) {
  if (cs == 1 && rs != 1 && n > 32) return b_steps_rows(k, n, b, rs, dst, panel_stride);
  for (index_t j = 0; j < n; j += 32)
    pack_b_panel(k, static_cast<int>(std::min<index_t>(32, n - j)), b + j * cs, rs, cs, dst + (j / 32) * panel_stride);
}

namespace {
// B's columns [j, j + cols) of rows from `row`: their address where they lie in one group of a grouped B
// (GemmArgs::b_group_cols), or B is not grouped; else null.
const float* b_columns(const GemmArgs<float>& g, index_t row, index_t j, index_t cols) {
  const float* b = g.b + row * g.rs_b;
  if (g.b_group_cols == 0) return b + j * g.cs_b;
  const index_t grp = j / g.b_group_cols, jj = j % g.b_group_cols;
  return jj + cols <= g.b_group_cols ? b + grp * g.b_group_stride + jj * g.cs_b : nullptr;
}

// Rows [b0, b1) of a grouped B split exactly (splittable, group by group).
bool grouped_b_splittable(const GemmArgs<float>& g, index_t b0, index_t b1) {
  for (index_t j = 0; j < g.n; j += g.b_group_cols)
    if (!splittable(b1 - b0, std::min(g.b_group_cols, g.n - j), b_columns(g, b0, j, 1), g.rs_b, g.cs_b)) return false;
  return true;
}

// The panel of columns [j, j + cols) of a grouped B across a group boundary, depth [pc, pc + k): each
// step's rows copied run by run (one run a group) into a row-major buffer, then split from there.
void pack_b_panel_grouped(const GemmArgs<float>& g, index_t pc, index_t k, index_t j, int cols, bf16* dst) {
  alignas(64) float buf[32 * 32];
  for_each_step(k, dst, [&](index_t p0, index_t kk, bf16* step) {
    for (index_t p = 0; p < kk; ++p) {
      for (int l = 0; l < cols;) {
        const index_t jj = (j + l) % g.b_group_cols;
        const int run = static_cast<int>(std::min<index_t>(cols - l, g.b_group_cols - jj));
        const float* src = b_columns(g, pc + p0 + p, j + l, run);
        for (int r = 0; r < run; ++r) buf[p * 32 + l + r] = src[r * g.cs_b];
        l += run;
      }
    }
    b_step_rows(cols, kk, buf, 32, step);
  });
}

// The tiles' C from a 32 x 32 buffer (row stride 32), the steps of one or two pairs of panels, and C
// back into the buffer.
template <class Side>
void run_in_buffer(float* acc, index_t nsteps, const bf16* a, const bf16* b, index_t nsteps2, const bf16* a2,
                   const bf16* b2, Side&& side) {
  _tile_loadd(0, acc, 128);
  _tile_loadd(1, acc + 16, 128);
  _tile_loadd(2, acc + 16 * 32, 128);
  _tile_loadd(3, acc + 16 * 32 + 16, 128);
  run_steps(nsteps, a, b, side);
  if (nsteps2 > 0) run_steps(nsteps2, a2, b2, side);
  _tile_stored(0, acc, 128);
  _tile_stored(1, acc + 16, 128);
  _tile_stored(2, acc + 16 * 32, 128);
  _tile_stored(3, acc + 16 * 32 + 16, 128);
}
}  // namespace

namespace {
// tile()'s body, with side() after every four tile products (see run_steps).
template <class Side>
void tile_side(index_t nsteps, const bf16* a, const bf16* b, float* c, index_t rs_c, index_t cs_c, int m, int n,
               float alpha, float beta, const float* bias, bool bias_rows, index_t nsteps2, const bf16* a2,
               const bf16* b2, Side&& side) {
  const bool in_tiles = m == 32 && n == 32 && cs_c == 1 && alpha == 1.f &&
                        (beta == 1.f ? !bias : beta == 0.f && (!bias || !bias_rows));
  if (in_tiles) {
    const index_t ld = rs_c * index_t(sizeof(float));
    if (beta == 1.f) {
      _tile_loadd(0, c, ld);
      _tile_loadd(1, c + 16, ld);
      _tile_loadd(2, c + 16 * rs_c, ld);
      _tile_loadd(3, c + 16 * rs_c + 16, ld);
    } else if (bias) {  // every row of the tile starts as the bias: a row stride of 0
      _tile_loadd(0, bias, 0);
      _tile_loadd(1, bias + 16, 0);
      _tile_loadd(2, bias, 0);
      _tile_loadd(3, bias + 16, 0);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
    }
    run_steps(nsteps, a, b, side);
    if (nsteps2 > 0) run_steps(nsteps2, a2, b2, side);
    _tile_stored(0, c, ld);
    _tile_stored(1, c + 16, ld);
    _tile_stored(2, c + 16 * rs_c, ld);
    _tile_stored(3, c + 16 * rs_c + 16, ld);
    return;
  }
  // Through a buffer. With alpha 1 the tiles start from beta * C + bias, as they start from C or the
  // bias above, so that an element's sum does not depend on where the tile's edges fall (an RNN's time
  // loop split by batch rows gives the bits it gives split by hidden units).
  alignas(64) float acc[32 * 32];
  const bool start_c = alpha == 1.f;
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 32; ++j) {
      float v = 0.f;
      if (start_c && i < m && j < n) {
        if (beta != 0.f) v = beta * c[i * rs_c + j * cs_c];
        if (bias) v += bias_rows ? bias[i] : bias[j];
      }
      acc[i * 32 + j] = v;
    }
  run_in_buffer(acc, nsteps, a, b, nsteps2, a2, b2, side);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float* y = c + i * rs_c + j * cs_c;
      float v = acc[i * 32 + j];
      if (!start_c) {
        v *= alpha;
        if (beta != 0.f) v += beta * *y;
        if (bias) v += bias_rows ? bias[i] : bias[j];
      }
      *y = v;
    }
}
}  // namespace

void tile(index_t nsteps, const bf16* a, const bf16* b, float* c, index_t rs_c, index_t cs_c, int m, int n,
          float alpha, float beta, const float* bias, bool bias_rows, index_t nsteps2, const bf16* a2,
          const bf16* b2) {
  tile_side(nsteps, a, b, c, rs_c, cs_c, m, n, alpha, beta, bias, bias_rows, nsteps2, a2, b2, [] {});
}

void tile_t(index_t nsteps, const bf16* a, const bf16* b, float* ct, index_t ldct, int m, int n, const float* bias,
            index_t nsteps2, const bf16* a2, const bf16* b2, SplitQueue* side, int side_rows, bool accumulate) {
  alignas(64) float acc[32 * 32];
  if (accumulate) {  // C from ct, each 16 x 16 quarter transposed back in registers
    for (int i0 = 0; i0 < 32; i0 += 16)
      for (int j0 = 0; j0 < 32; j0 += 16) {
        __m512i v[16];
        const __mmask16 rows = i0 < m ? first(m - i0) : 0;
        for (int c = 0; c < 16; ++c)
          v[c] = j0 + c < n ? _mm512_maskz_loadu_epi32(rows, ct + (j0 + c) * ldct + i0) : _mm512_setzero_si512();
        transpose16(v);
        for (int r = 0; r < 16; ++r) _mm512_store_si512(acc + (i0 + r) * 32 + j0, v[r]);
      }
  } else {
    for (int i = 0; i < 32; ++i) {
      const __m512 v = _mm512_set1_ps(bias && i < m ? bias[i] : 0.f);
      _mm512_store_ps(acc + i * 32, v);
      _mm512_store_ps(acc + i * 32 + 16, v);
    }
  }
  if (side && side_rows > 0)
    run_in_buffer(acc, nsteps, a, b, nsteps2, a2, b2, [side, side_rows] { split_rows(*side, side_rows); });
  else
    run_in_buffer(acc, nsteps, a, b, nsteps2, a2, b2, [] {});
  // Each 16 x 16 quarter transposed in registers: its column c is C's row block's values for column c.
  for (int i0 = 0; i0 < m; i0 += 16)
    for (int j0 = 0; j0 < n; j0 += 16) {
      __m512i v[16];
      for (int r = 0; r < 16; ++r) v[r] = _mm512_load_si512(acc + (i0 + r) * 32 + j0);
      transpose16(v);
      const __mmask16 rows = first(m - i0);
      for (int c = 0; c < std::min(16, n - j0); ++c) _mm512_mask_storeu_epi32(ct + (j0 + c) * ldct + i0, rows, v[c]);
    }
}

double tile_peak_gflops(int nthreads, double seconds) {
  // bfloat16 ones in A and B (the tile unit runs faster on zeros), C in tiles 0-3, four independent
  // products per iteration.
  alignas(64) static bf16 ones[512];
  for (bf16& v : ones) v = 0x3f80;
  auto run = [](index_t iters) {
    const TileScope tiles;
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (index_t i = 0; i < iters; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    alignas(64) float c[256];
    _tile_stored(0, c, 64);
    return double(c[0]);
  };
  index_t iters = 1 << 12;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    run(iters);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > seconds / 4 || iters > (index_t(1) << 36)) {
      iters = std::max<index_t>(1, static_cast<index_t>(iters * (seconds / dt)));
      break;
    }
    iters *= 4;
  }
  double sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nthreads) reduction(+ : sink)
  sink += run(iters);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = double(nthreads) * double(iters) * 4 * 16 * 16 * 32 * 2;
  return sink < 0 ? 0.0 : flops / dt / 1e9;
}

#undef DNNKIT_LA
#undef DNNKIT_LB
#undef DNNKIT_T4

#pragma GCC diagnostic pop

bool gemm_tiles(const GemmArgs<float>& g, const Plan& p) {
  // B packed ahead for the FMA kernels (PackedB, NR-wide panels of full depth) is read as a strided B
  // with 32-wide panels: panel jp's element (p, j) at b_panels + jp*32*k + p*32 + j.
  const bool panels = g.b_panels != nullptr;
  const index_t kc_steps = p.kc / kStep, panel = kc_steps * kStepElems;
  const index_t b_block = p.nc / 32 * panel;
  AlignedBuffer<bf16> abuf(static_cast<std::size_t>((p.own_a ? 2 * p.nthreads : p.mc / 32) * panel));
  AlignedBuffer<bf16> bbuf(static_cast<std::size_t>(b_block * (p.split_n ? p.nthreads : 1)));
  // The bias starts the tiles on the first depth block where C is not read, else joins the last.
  const bool bias_first = g.beta == 0.f && !g.bias_per_row;

  std::atomic<bool> unsplit{false};

#pragma omp parallel num_threads(p.nthreads) if (p.nthreads > 1)
  {
    const int tid = thread_id(), nt = thread_count();
    // Every value of A and B looked at first, a share of each per thread: a product with one the tiles
    // cannot split leaves before C is touched, for the FMA kernels.
    {
      const auto [a0, a1] = even_share(g.m, tid, nt);
      bool ok = splittable(a1 - a0, g.k, g.a + a0 * g.rs_a, g.rs_a, g.cs_a);
      if (ok && panels) {
        const auto [b0, b1] = even_share(ceil_div(g.n, index_t(kBlock)) * kBlock * g.k, tid, nt);
        ok = splittable(1, b1 - b0, g.b_panels + b0, 0, 1);
      } else if (ok) {
        const auto [b0, b1] = even_share(g.k, tid, nt);
        ok = g.b_group_cols ? grouped_b_splittable(g, b0, b1)
                            : splittable(b1 - b0, g.n, g.b + b0 * g.rs_b, g.rs_b, g.cs_b);
      }
      if (!ok) unsplit.store(true, std::memory_order_relaxed);
    }
#pragma omp barrier
    const bool run_tiles = !unsplit.load(std::memory_order_relaxed);
    std::optional<TileScope> tiles;
    if (run_tiles) tiles.emplace();
    // A depth block [pc, pc + kc): its steps, and the scale of C, the bias and the activation it takes.
    struct DepthBlock {
      index_t pc, kc, ns;
      float beta;
      const float* bias;
      bool act;
    };
    auto depth_block = [&](index_t pc) {
      DepthBlock d;
      d.pc = pc;
      d.kc = std::min(p.kc, g.k - pc);
      d.ns = steps(d.kc);
      const bool first_k = pc == 0, last_k = pc + d.kc >= g.k;
      d.beta = first_k ? g.beta : 1.f;
      d.bias = g.bias && (bias_first ? first_k : last_k) ? g.bias : nullptr;
      d.act = last_k && g.act != Activation::identity;
      return d;
    };
    // The B panel of columns [j, j + 32) of depth block d, at dst.
    auto pack_b = [&](const DepthBlock& d, index_t j, bf16* dst) {
      const int cols = static_cast<int>(std::min<index_t>(32, g.n - j));
      if (panels) return pack_b_panel(d.kc, cols, g.b_panels + j * g.k + d.pc * 32, 32, 1, dst);
      if (const float* b = b_columns(g, d.pc, j, cols)) return pack_b_panel(d.kc, cols, b, g.rs_b, g.cs_b, dst);
      pack_b_panel_grouped(g, d.pc, d.kc, j, cols, dst);
    };
    // A thread's own B block, columns [jc, jc + nc) of depth block d, as panels at dst.
    auto pack_b_block = [&](const DepthBlock& d, index_t jc, index_t nc, bf16* dst) {
      if (!panels && !g.b_group_cols)
        return pack_b_panels(d.kc, nc, g.b + d.pc * g.rs_b + jc * g.cs_b, g.rs_b, g.cs_b, dst, panel);
      for (index_t jr = 0; jr < ceil_div(nc, index_t(32)); ++jr) pack_b(d, jc + jr * 32, dst + jr * panel);
    };
    // C's tile at rows [i, i + 32) and columns [j, j + 32) over depth block d from the panels ap and bp,
    // side() between its tile products; then the activation on the last depth block.
    auto run_tile = [&](const DepthBlock& d, index_t i, index_t j, const bf16* ap, const bf16* bp, auto&& side) {
      const int m_t = static_cast<int>(std::min<index_t>(32, g.m - i));
      const int n_t = static_cast<int>(std::min<index_t>(32, g.n - j));
      float* c = g.c + i * g.rs_c + j * g.cs_c;
      // A bias per row (the transposed problem's) goes through tile()'s buffer.
      const float* bb = d.bias ? d.bias + (g.bias_per_row ? i : j) : nullptr;
      tile_side(d.ns, ap, bp, c, g.rs_c, g.cs_c, m_t, n_t, g.alpha, d.beta, bb, g.bias_per_row, 0, nullptr, nullptr,
                side);
      if (d.act) apply_epilogue<float>(c, g.rs_c, g.cs_c, m_t, n_t, nullptr, g.act);
    };
    auto no_side = [] {};

    for (index_t pc = 0; run_tiles && p.own_a && pc < g.k; pc += p.kc) {
      // This thread's B block against every A panel in turn; no other thread's data is read, so no
      // barrier. The blocks' order for each element of C (depth blocks in order) is the shared path's.
      const index_t jc = tid * p.nc;
      if (jc >= g.n) break;
      const DepthBlock d = depth_block(pc);
      const index_t nc = std::min(p.nc, g.n - jc), n_jr = ceil_div(nc, 32), n_ir = ceil_div(g.m, 32);
      bf16* const bp = bbuf.data() + tid * b_block;
      pack_b_block(d, jc, nc, bp);
      bf16* const ap[2] = {abuf.data() + 2 * tid * panel, abuf.data() + (2 * tid + 1) * panel};
      SplitQueue queue;
      auto add_panel = [&](index_t ir) {
        const index_t i = ir * 32;
        queue.add(static_cast<int>(std::min<index_t>(32, g.m - i)), d.kc, g.a + i * g.rs_a + pc, g.rs_a, ap[ir % 2]);
      };
      queue.clear();
      add_panel(0);
      queue.finish();
      // A panel's 32 rows at each of its steps, over its n_jr tiles' 6 calls of side() a step.
      const int side_rows = static_cast<int>(ceil_div(index_t(kBlock), 6 * n_jr));
      auto side = [&queue, side_rows] { split_rows(queue, side_rows); };
      for (index_t ir = 0; ir < n_ir; ++ir) {
        queue.clear();
        if (ir + 1 < n_ir) add_panel(ir + 1);
        for (index_t jr = 0; jr < n_jr; ++jr) run_tile(d, ir * 32, jc + jr * 32, ap[ir % 2], bp + jr * panel, side);
        queue.finish();
      }
    }
    for (index_t ic = 0; run_tiles && !p.own_a && ic < g.m; ic += p.mc) {
      const index_t mc = std::min(p.mc, g.m - ic), n_ir = ceil_div(mc, 32);
      for (index_t pc = 0; pc < g.k; pc += p.kc) {
        const DepthBlock d = depth_block(pc);
        auto pack_a = [&](index_t ir) {
          const index_t i = ic + ir * 32;
          pack_a_panel(static_cast<int>(std::min<index_t>(32, g.m - i)), d.kc, g.a + i * g.rs_a + pc * g.cs_a, g.rs_a,
                       g.cs_a, abuf.data() + ir * panel);
        };
        auto run = [&](index_t ir, index_t jc, index_t jr, const bf16* bp) {
          run_tile(d, ic + ir * 32, jc + jr * 32, abuf.data() + ir * panel, bp + jr * panel, no_side);
        };
        if (p.split_n) {
          for (index_t ir = tid; ir < n_ir; ir += nt) pack_a(ir);
#pragma omp barrier
          bf16* own = bbuf.data() + tid * b_block;
          for (index_t jb = tid; jb * p.nc < g.n; jb += nt) {
            const index_t jc = jb * p.nc, nc = std::min(p.nc, g.n - jc), n_jr = ceil_div(nc, 32);
            pack_b_block(d, jc, nc, own);
            for (index_t ir = 0; ir < n_ir; ++ir)
              for (index_t jr = 0; jr < n_jr; ++jr) run(ir, jc, jr, own);
          }
#pragma omp barrier
        } else {
          const auto [ir0, ir1] = even_share(n_ir, tid, nt);
          for (index_t ir = ir0; ir < ir1; ++ir) pack_a(ir);
          for (index_t jc = 0; jc < g.n; jc += p.nc) {
            const index_t n_jr = ceil_div(std::min(p.nc, g.n - jc), 32);
#pragma omp for schedule(static)
            for (index_t jr = 0; jr < n_jr; ++jr) pack_b(d, jc + jr * 32, bbuf.data() + jr * panel);
            for (index_t ir = ir0; ir < ir1; ++ir)
              for (index_t jr = 0; jr < n_jr; ++jr) run(ir, jc, jr, bbuf.data());
#pragma omp barrier
          }
        }
      }
    }
  }
  return !unsplit.load();
}

}  // namespace amx
}  // namespace dnnkit
