// The RNN post-GEMM kernels of gates.h for AVX-512F (the traits of csrc/simd/avx512.h: 16 floats or 8
// doubles a vector, tails under a k-mask, 2^n by VSCALEFPS/PD).
#include <type_traits>

#include "gates.h"

// GCC 12 warns that the _mm512_undefined_ps() inside the unmasked intrinsics may be used uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "../simd/avx512.h"
#include "gates_simd.h"

namespace dnnkit {
namespace {

using simd::Avx512F32;
using simd::Avx512F64;

const GateKernelsF32 kAvx512 = {gates_simd::lstm_fwd<Avx512F32>, gates_simd::gru_fwd<Avx512F32>,
                                gates_simd::rnn_fwd<Avx512F32>, gates_simd::lstm_bwd<Avx512F32>};
const GateKernelsF64 kAvx512D = {gates_simd::lstm_fwd<Avx512F64>, gates_simd::gru_fwd<Avx512F64>,
                                 gates_simd::rnn_fwd<Avx512F64>, gates_simd::lstm_bwd<Avx512F64>};

}  // namespace

const GateKernelsF32* gate_kernels_avx512() { return &kAvx512; }
const GateKernelsF64* gate_kernels_avx512_f64() { return &kAvx512D; }

}  // namespace dnnkit

#pragma GCC diagnostic pop
