// The RNN post-GEMM kernels of gates.h for AVX2 and FMA (the traits of csrc/simd/avx2.h: 8 floats or 4
// doubles a vector, x clamped for exp as fastmath::exp clamps it).
#include <type_traits>

#include "../simd/avx2.h"
#include "gates.h"
#include "gates_simd.h"

namespace dnnkit {
namespace {

using simd::Avx2F32;
using simd::Avx2F64;

const GateKernelsF32 kAvx2 = {gates_simd::lstm_fwd<Avx2F32>, gates_simd::gru_fwd<Avx2F32>, gates_simd::rnn_fwd<Avx2F32>,
                              gates_simd::lstm_bwd<Avx2F32>};
const GateKernelsF64 kAvx2D = {gates_simd::lstm_fwd<Avx2F64>, gates_simd::gru_fwd<Avx2F64>, gates_simd::rnn_fwd<Avx2F64>,
                               gates_simd::lstm_bwd<Avx2F64>};

}  // namespace

const GateKernelsF32* gate_kernels_avx2() { return &kAvx2; }
const GateKernelsF64* gate_kernels_avx2_f64() { return &kAvx2D; }

}  // namespace dnnkit

