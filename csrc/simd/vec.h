// Generic vectors (GCC's vector extension; csrc/simd/README.md): code written once with them and
// compiled in every module gets that module's instructions. 64-byte vectors of T (Vec<T>, vec_t<T>),
// one register's vectors (reg_vec_t<T>), 32-byte ones (TransposeVec<T>), their loads and stores, and
// transposes held in registers.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __AVX__
#include <immintrin.h>
#endif

#include "../common.h"

namespace dnnkit {

// One 64-byte vector of T (GCC vector extension: one AVX-512 register in the AVX-512 module, two or four
// narrower ones in the others).
template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(64)));
  static constexpr int lanes = 64 / sizeof(T);
};

// Integer vectors of the same shape (shuffle masks).
template <typename T>
struct VecI;
template <>
struct VecI<float> {
  typedef std::int32_t type __attribute__((vector_size(64)));
};
template <>
struct VecI<double> {
  typedef std::int64_t type __attribute__((vector_size(64)));
};

template <typename V, typename T>
inline V vload(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V, typename T>
inline void vstore(T* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// Copies n <= N values from src to dst (N a power of two, at most a Vec's lanes): one masked load and
// store where AVX-512 has them.
template <typename T, int N = Vec<T>::lanes>
inline void copy_lanes(T* dst, const T* src, int n) {
  static_assert(N > 0 && (N & (N - 1)) == 0 && N <= Vec<T>::lanes, "copy_lanes: N a power of two up to a Vec");
#ifdef __AVX512F__
  if constexpr (sizeof(T) == 4) {
    const __mmask16 k = static_cast<__mmask16>((1u << n) - 1);
    _mm512_mask_storeu_ps(dst, k, _mm512_maskz_loadu_ps(k, src));
  } else {
    const __mmask8 k = static_cast<__mmask8>((1u << n) - 1);
    _mm512_mask_storeu_pd(dst, k, _mm512_maskz_loadu_pd(k, src));
  }
#else
  // Pieces of a power-of-two size each, the largest first: every piece one or two moves of a known size
  // (a loop of run-time length would be a call to memcpy).
  int i = 0;
#pragma GCC unroll 8
  for (int w = N; w >= 1; w /= 2)
    if (n & w) {
      std::memcpy(dst + i, src + i, sizeof(T) * w);
      i += w;
    }
#endif
}

// In-place transpose of an L x L block held as L vectors (L = lanes): swap the off-diagonal H x H
// blocks of every 2H x 2H block, for H = L/2, ..., 1.
template <typename T, int H>
inline void transpose_stage(typename Vec<T>::type* r) {
  using IV = typename VecI<T>::type;
  constexpr int L = Vec<T>::lanes;
  IV lo, hi;
  for (int j = 0; j < L; ++j) {
    lo[j] = (j & H) ? L + j - H : j;  // row r keeps its left half, takes row r+H's left half on the right
    hi[j] = (j & H) ? L + j : j + H;  // row r+H takes row r's right half on the left, keeps its right half
  }
#pragma GCC unroll 16
  for (int i = 0; i < L; ++i)
    if (!(i & H)) {
      const typename Vec<T>::type a = r[i], b = r[i + H];
      r[i] = __builtin_shuffle(a, b, lo);
      r[i + H] = __builtin_shuffle(a, b, hi);
    }
  if constexpr (H > 1) transpose_stage<T, H / 2>(r);
}
template <typename T>
inline void transpose_lanes(typename Vec<T>::type* r) {
  transpose_stage<T, Vec<T>::lanes / 2>(r);
}

// The 64-byte vector of T itself.
template <typename T>
using vec_t = typename Vec<T>::type;

// One register's vector: the widest the module's instructions hold in one register (64 bytes with
// AVX-512, 32 with AVX, 16 below), and how many such registers there are. A kernel that keeps a block of
// accumulators in registers sizes the block by these: a 64-byte vector is two registers on AVX2, and
// GCC holds a block of them that outgrows the register file on the stack.
#if defined(__AVX512F__)
constexpr int kRegBytes = 64;
constexpr int kVecRegs = 32;
#elif defined(__AVX__)
constexpr int kRegBytes = 32;
constexpr int kVecRegs = 16;
#else
constexpr int kRegBytes = 16;
constexpr int kVecRegs = 16;
#endif
template <typename T>
struct RegVec {
  typedef T type __attribute__((vector_size(kRegBytes)));
  static constexpr int lanes = kRegBytes / sizeof(T);
};
template <typename T>
using reg_vec_t = typename RegVec<T>::type;

// A store of one register's vector at p (aligned to kRegBytes) that bypasses the caches where the module
// has the instruction (a plain store in the reference module), and the fence that orders such stores
// before what follows them (another thread's reads included).
template <typename T>
inline void vstore_stream(T* p, reg_vec_t<T> v) {
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 4) _mm512_stream_ps(p, reinterpret_cast<__m512>(v));
  else _mm512_stream_pd(p, reinterpret_cast<__m512d>(v));
#elif defined(__AVX__)
  if constexpr (sizeof(T) == 4) _mm256_stream_ps(p, reinterpret_cast<__m256>(v));
  else _mm256_stream_pd(p, reinterpret_cast<__m256d>(v));
#else
  vstore(p, v);
#endif
}
inline void stream_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

// x in every lane of a generic vector: x - (+0) is x exactly (-0 and NaN included), so the subtraction
// folds away where 0 + x (which turns -0 into +0) would be computed.
template <typename V, typename T>
inline V splat(T x) {
  return x - V{};
}

// Transposes of W x W blocks (W = 8 floats or 4 doubles, 32 bytes a row) in vector registers, written
// with GCC's generic vectors so that every ISA the translation unit is built for gets its own shuffles.
template <typename T>
constexpr index_t kTransposeBlock = 32 / sizeof(T);

typedef float tv8f __attribute__((vector_size(32)));
typedef double tv4d __attribute__((vector_size(32)));
template <typename T>
using TransposeVec = std::conditional_t<sizeof(T) == 4, tv8f, tv4d>;

// out[i] = column i of the W x W matrix whose rows are r[0..W).
__attribute__((always_inline)) inline void transpose_regs(const tv8f* r, tv8f* out) {
  typedef int i8 __attribute__((vector_size(32)));
  tv8f t[8], u[8];
  // Interleave pairs of rows, then pairs of pairs, then halves: three stages of a transpose network.
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shuffle(r[i], r[i + 1], i8{0, 8, 1, 9, 4, 12, 5, 13});
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], i8{2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      u[i + h] = __builtin_shuffle(t[i + h], t[i + h + 2], i8{0, 1, 8, 9, 4, 5, 12, 13});
      u[i + h + 2] = __builtin_shuffle(t[i + h], t[i + h + 2], i8{2, 3, 10, 11, 6, 7, 14, 15});
    }
  // The last stage's results are columns 0, 2, 1, 3 (the first stage's order), then 4, 6, 5, 7.
  constexpr int col_of[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int i = 0; i < 4; ++i) {
    out[col_of[i]] = __builtin_shuffle(u[i], u[i + 4], i8{0, 1, 2, 3, 8, 9, 10, 11});
    out[col_of[i + 4]] = __builtin_shuffle(u[i], u[i + 4], i8{4, 5, 6, 7, 12, 13, 14, 15});
  }
}

__attribute__((always_inline)) inline void transpose_regs(const tv4d* r, tv4d* out) {
  typedef long long i4 __attribute__((vector_size(32)));
  tv4d t[4];
  t[0] = __builtin_shuffle(r[0], r[1], i4{0, 4, 2, 6});
  t[1] = __builtin_shuffle(r[0], r[1], i4{1, 5, 3, 7});
  t[2] = __builtin_shuffle(r[2], r[3], i4{0, 4, 2, 6});
  t[3] = __builtin_shuffle(r[2], r[3], i4{1, 5, 3, 7});
  out[0] = __builtin_shuffle(t[0], t[2], i4{0, 1, 4, 5});
  out[1] = __builtin_shuffle(t[1], t[3], i4{0, 1, 4, 5});
  out[2] = __builtin_shuffle(t[0], t[2], i4{2, 3, 6, 7});
  out[3] = __builtin_shuffle(t[1], t[3], i4{2, 3, 6, 7});
}

}  // namespace dnnkit
