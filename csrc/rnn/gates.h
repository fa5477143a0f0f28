// The post-GEMM kernels of the RNNs written with explicit vectors, one table per ISA and dtype (AVX2 and
// AVX-512 translation units, chosen at run time), and the accessors that pick the table for the active ISA.
//
// Each kernel computes, for hidden units [j0, j1) of one batch row, what the portable loops in rnn.cpp
// compute (their comments give the formulas and the operands), with the element-wise functions of
// csrc/simd/vmath.h (fastmath's formulas for float32; exp, expm1 and tanh to within a few units in the
// last place for float64, where the portable loops call the C library) evaluated a whole vector at a
// time. NaN propagates through every function. The tail of a row runs under a mask.
#pragma once
#include "../common.h"
#include "../cpu_info.h"

#include <type_traits>

namespace dnnkit {

template <typename T>
struct GateKernels {
  // lstm_fwd / gru_fwd / rnn_fwd / lstm_bwd: the signatures of the portable kernels in rnn.cpp (a null gh,
  // or GRU's ghrz: the hidden projections are already summed into xp).
  void (*lstm_fwd)(index_t H, index_t j0, index_t j1, const T* xp, const T* gh, const T* cp, T* c, T* h, T* save);
  void (*gru_fwd)(index_t H, index_t j0, index_t j1, const T* xp, const T* ghrz, const T* ghn, const T* bhn,
                  const T* hp, T* h, T* save, T* aux);
  void (*rnn_fwd)(bool relu, index_t j0, index_t j1, const T* xp, const T* gh, T* h);
  void (*lstm_bwd)(index_t H, index_t j0, index_t j1, const T* dy, const T* dhr, const T* gates, const T* c,
                   const T* cp, T* dc, T* dg);
};
using GateKernelsF32 = GateKernels<float>;
using GateKernelsF64 = GateKernels<double>;

const GateKernelsF32* gate_kernels_avx2();
const GateKernelsF32* gate_kernels_avx512();
const GateKernelsF64* gate_kernels_avx2_f64();
const GateKernelsF64* gate_kernels_avx512_f64();

// The table for the active ISA, or null (the portable loops) below AVX2.
inline const GateKernelsF32* gate_kernels_f32() {
  switch (active_isa()) {
#if DNNKIT_HAVE_AVX512
    case Isa::avx512: return gate_kernels_avx512();
#endif
#if DNNKIT_HAVE_AVX2
    case Isa::avx2: return gate_kernels_avx2();
#endif
    default: return nullptr;
  }
}

inline const GateKernelsF64* gate_kernels_f64() {
  switch (active_isa()) {
#if DNNKIT_HAVE_AVX512
    case Isa::avx512: return gate_kernels_avx512_f64();
#endif
#if DNNKIT_HAVE_AVX2
    case Isa::avx2: return gate_kernels_avx2_f64();
#endif
    default: return nullptr;
  }
}

template <typename T>
const GateKernels<T>* gate_kernels() {
  if constexpr (std::is_same_v<T, float>) return gate_kernels_f32();
  else return gate_kernels_f64();
}

}  // namespace dnnkit
