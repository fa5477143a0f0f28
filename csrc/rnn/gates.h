// The float32 post-GEMM kernels of the RNNs written with explicit vectors, one table per ISA (AVX2 and
// AVX-512 translation units, chosen at run time), and the accessor that picks the table for the active ISA.
//
// Each kernel computes, for hidden units [j0, j1) of one batch row, what the portable loops in rnn.cpp
// compute (their comments give the formulas and the operands), with the element-wise functions of
// fastmath evaluated a whole vector at a time: exp by range reduction and the same degree-6 polynomial,
// 2^n applied with VSCALEFPS (AVX-512) or built in the exponent bits (AVX2); sigmoid from exp(-|x|),
// so that no intermediate overflows; tanh as an odd polynomial below |x| = 0.625 and (1 - e)/(1 + e),
// e = exp(-2|x|), above. The reciprocal is VRCP14PS refined by one Newton step on AVX-512 and a
// division on AVX2. NaN propagates through every function. The tail of a row runs under a mask.
#pragma once
#include "../common.h"
#include "../cpu_info.h"

namespace dnnkit {

struct GateKernelsF32 {
  // lstm_fwd / gru_fwd / rnn_fwd / lstm_bwd: the signatures of the portable kernels in rnn.cpp (a null gh,
  // or GRU's ghrz: the hidden projections are already summed into xp).
  void (*lstm_fwd)(index_t H, index_t j0, index_t j1, const float* xp, const float* gh, const float* cp, float* c,
                   float* h, float* save);
  void (*gru_fwd)(index_t H, index_t j0, index_t j1, const float* xp, const float* ghrz, const float* ghn,
                  const float* bhn, const float* hp, float* h, float* save, float* aux);
  void (*rnn_fwd)(bool relu, index_t j0, index_t j1, const float* xp, const float* gh, float* h);
  void (*lstm_bwd)(index_t H, index_t j0, index_t j1, const float* dy, const float* dhr, const float* gates,
                   const float* c, const float* cp, float* dc, float* dg);
  // exp (fn 0), sigmoid (1), tanh (2), gelu (3) or gelu's derivative (4) of m rows of n values (x's rows
  // ldx apart, y's ldy; in place allowed): the functions above, for tests, the GEMM's epilogue (a tile at
  // a time) and the activations' forward and backward passes (m = 1).
  void (*math)(int fn, const float* x, index_t ldx, float* y, index_t ldy, index_t m, index_t n);
};

const GateKernelsF32* gate_kernels_avx2();
const GateKernelsF32* gate_kernels_avx512();

// The table for the active ISA, or null (the portable loops) below AVX2.
inline const GateKernelsF32* gate_kernels_f32() {
  switch (active_isa()) {
    case Isa::avx512: return gate_kernels_avx512();
    case Isa::avx2: return gate_kernels_avx2();
    default: return nullptr;
  }
}

}  // namespace dnnkit
