// Fused RNN cells and sequences on the CPU: LSTM, GRU and Elman RNN (tanh or ReLU), forward and backward
// through time, with torch.nn.LSTM's semantics and weight shapes.
//
// Shapes (row-major, time-major; T steps, B batch rows, I inputs, H hidden units, L layers, D = 1 or 2
// directions, G gates: LSTM 4 (i, f, g, o), GRU 3 (r, z, n), RNN 1):
//   x (T, B, I);  layer outputs y[l] (T, B, D*S), direction d in columns [d*S, d*S + S);
//   h0, h_n (L*D, B, S);  c0, c_n (L*D, B, H);  per layer l and direction d (index l*D + d):
//   w_ih (G*H, I_l) with I_0 = I and I_l = D*S above;  w_hh (G*H, S);  b_ih, b_hh (G*H) or null;
//   w_hr (P, H) for an LSTM with a projection (torch.nn.LSTM's proj_size = P).
// S, the size of h, is H, or P with a projection: there h_t = W_hr m_t with m_t = o * tanh(c_t), the
// step's second product (a barrier before it: it reads all of m_t; the threads own blocks of P columns).
//
// One layer-direction, forward (oneDNN's gemm_layer / gemm_iter / post-GEMM split):
//   1. XP (T*B, G*H) = X W_ih^T + b: every step's input projection in one GEMM, the summed bias fused
//      (b = b_ih + b_hh; GRU's n gate takes b_in only, since b_hn sits inside r * (...)).
//   2. W_hh^T packed once per call (PackedB, one per gate) and reused at every step.
//   3. Per step: GH = h_{t-1} W_hh^T over the packed panels, then one fused element-wise pass (the
//      post-GEMM: nonlinearities, state update, the output slice, the saved gates) per hidden unit.
// The time loop runs in one parallel region: each thread owns a contiguous range of NR-wide blocks of
// hidden units, computes all G gates' GEMM columns for them and their post-GEMM (no data leaves the
// thread between the two), then meets the others at one barrier per step (the next step reads all of
// h_t). The two directions of a bidirectional layer are independent and run concurrently on halves of
// the threads. A sequence of one step uses plain GEMMs (packing would cost more than it saves).
//
// Backward through time reverses the loop: per step, the post-GEMM's derivative (dG, the gradient of
// the gates' pre-activations) for owned hidden units, a barrier, then dh_{t-1} = dG_t W_hh over W_hh
// packed once (owned columns again). Weight, bias and input gradients are then whole-sequence GEMMs:
// dW_ih = dG^T X, dW_hh = dG^T [h_{t-1}], db = column sums of dG, dX = dG W_ih.
#pragma once
#include <vector>

#include "../common.h"

namespace dnnkit {

enum class RnnCell : int { lstm = 0, gru = 1, rnn_tanh = 2, rnn_relu = 3 };

inline int rnn_gates(RnnCell cell) {
  switch (cell) {
    case RnnCell::lstm: return 4;
    case RnnCell::gru: return 3;
    default: return 1;
  }
}

// How the threads share a sequence's time loop: `automatic` takes the rule of rnn_splits_rows and
// rnn_uses_wavefront; the others ask for one schedule (the registry's fused_units, fused_rows and
// fused_wavefront), used wherever the shape allows it and otherwise the hidden-unit split.
//   units:     the threads of a direction share each step's hidden units (a barrier a step);
//   rows:      each thread runs its own batch rows through every step (no barrier);
//   wavefront: a stack's layers pipelined, one thread a layer, in chunks of steps (forward only).
enum class RnnSchedule : int { automatic = 0, units = 1, rows = 2, wavefront = 3 };

// How a single step from a given h0 (a cell, or every layer of a one-step sequence without a
// projection) computes its products: `automatic` takes the rule (rnn_cell_path: AMX tiles where the
// batch fills them and the values split, else the strided-A kernel where the batch fills its tiles, dot
// products at a few rows, two GEMMs otherwise); the others ask for one path (the registry's
// fused_cell_*), used wherever the step allows it (direct: an ISA with the strided-A kernel; dots: at
// most kSmallCellRows rows), and otherwise two GEMMs.
//   direct: both products and the post-GEMM in one pass on the strided-A kernel ([x | h0] packed once);
//   dots:   the same on gemm_small_m's dot products;
//   gemm:   the input and recurrent products as two GEMMs, then the post-GEMM.
enum class RnnCellPath : int { automatic = 0, direct = 1, dots = 2, gemm = 3 };

// Whether a float32 problem's products run on AMX tiles (where amx::active()): `automatic` takes the rule
// (the time loop where each thread's batch rows fill 3/4 of a tile, a cell from 64 rows (96 where I + S
// < 512) whose panels fit L2, a cell on packed weights from 24 rows; the registry's fused), `off` never
// (every other registry entry: the FMA kernels' paths), `on` wherever the tiles can compute it exactly,
// whatever the batch (fused_amx): float32, no projection, not ReLU in the time loop, and values that
// split exactly into three bfloat16 parts (amx::splittable; where they do not, the FMA kernels run).
enum class RnnTiles : int { automatic = 0, off = 1, on = 2 };

struct RnnShape {
  RnnCell cell = RnnCell::lstm;
  RnnSchedule schedule = RnnSchedule::automatic;
  RnnCellPath cell_path = RnnCellPath::automatic;
  RnnTiles tiles = RnnTiles::automatic;
  index_t seq = 0, batch = 0, input = 0, hidden = 0;  // T, B, I, H
  int layers = 1, dirs = 1;                          // L, D
  index_t proj = 0;                                  // P: LSTM projection size (0: none)
  // S: the size of h (the recurrent state and each direction's output), P with a projection, else H.
  index_t state() const { return proj > 0 ? proj : hidden; }
  index_t input_of(int layer) const { return layer == 0 ? input : dirs * state(); }
};

// Per layer-direction pointers (index l*D + d); biases may be null (bias=False).
template <typename T>
class PackedB;

template <typename T>
struct RnnWeights {
  std::vector<const T*> w_ih, w_hh, b_ih, b_hh, w_hr;  // w_hr: (P, H) with a projection, else empty
  // A cell's weights packed by the caller (dnnkit.pack_weight: W_ih^T and W_hh^T, PackedB of I x GH and
  // S x GH): when set (one step, one layer, one direction, no projection), rnn_forward multiplies by
  // them and w_ih, w_hh are not read.
  const PackedB<T>* packed_ih = nullptr;
  const PackedB<T>* packed_hh = nullptr;
};
template <typename T>
struct RnnWeightGrads {
  std::vector<T*> w_ih, w_hh, b_ih, b_hh, w_hr;  // b_* null when the forward had no biases
  bool accumulate = false;  // add the gradients to what the arrays hold (else overwrite them)
};

// Elements of the reserve (what backward reads) for one layer-direction, and for the whole problem:
// LSTM saves the activated gates (T, B, 4H) and the cell states c_t (T, B, H), and with a projection
// also m_t = o * tanh(c_t) (T, B, H); GRU the activated gates (T, B, 3H) and W_hn h_{t-1} + b_hn
// (T, B, H); RNN nothing (h_t is in the layer output).
index_t rnn_reserve_elems_per_dir(const RnnShape& s);
index_t rnn_reserve_elems(const RnnShape& s);

// Whether rnn_forward runs the layers as a wavefront pipeline (one thread per layer, chunks of steps)
// rather than one layer after another with the threads sharing each step: for unidirectional
// multi-layer RNNs whose recurrent weights are small. A schedule other than automatic decides (where the
// shape allows a wavefront at all).
bool rnn_uses_wavefront(const RnnShape& s, index_t elem_size);

// Whether the threads of one direction split a sequence's time loop by batch rows rather than by hidden
// units: each thread then runs its own rows through every step with no barrier, reading all of W_hh;
// chosen where W_hh stays in a core's L2 and each thread gets 4 rows or more. A schedule other than
// automatic decides (where every thread of a direction gets 4 rows or more).
bool rnn_splits_rows(const RnnShape& s, index_t elem_size);

// The path a one-step layer of input width `input` takes from a given h0 (no projection): the one
// s.cell_path names where the step allows it, else (and for automatic) the rule, AMX tiles aside (they
// also depend on the values: cells.cpp, cell_on_tiles).
RnnCellPath rnn_cell_path(const RnnShape& s, index_t input, index_t elem_size);

// Forward. x, the y[l] (L arrays; the last is the output) and the reserve are C-contiguous. h0 and c0
// may be null (zeros); h_n and c_n may be null (not written); reserve null: inference (nothing saved).
// Runs on get_num_threads() threads; throws std::bad_alloc before any parallel region.
template <typename T>
void rnn_forward(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0, T* const* y,
                 T* h_n, T* c_n, T* reserve);

// Backward through time from the forward's x, h0, c0 (null as there), y[l] and reserve. dy (T, B, D*S),
// dh_n (L*D, B, S) and dc_n (L*D, B, H) may be null (zeros). Writes dx (T, B, I), dh0 (L*D, B, S), dc0
// (L*D, B, H; LSTM only, may be null) and every weight and bias gradient (overwritten, not accumulated).
template <typename T>
void rnn_backward(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                  const T* const* y, const T* reserve, const T* dy, const T* dh_n, const T* dc_n, T* dx, T* dh0,
                  T* dc0, const RnnWeightGrads<T>& dw);

// The post-GEMM's element-wise functions on n contiguous values, for accuracy tests: fn 0 exp,
// 1 sigmoid, 2 tanh.
template <typename T>
void rnn_math_test(int fn, const T* x, T* y, index_t n);

// A test of the work sharing of rnn_forward's steps: nt threads run `steps` steps over `panels` panels,
// each panel after a busy wait of a pseudo-random length (up to about max_spin iterations), so that
// threads finish their own ranges at different times and take the others'. Returns the number of panels
// run other than exactly once in their step (0 when correct) in errors, and the number run by a
// thread other than their owner in stolen.
void rnn_panel_share_test(int nt, index_t panels, index_t steps, int max_spin, index_t* errors, index_t* stolen);

}  // namespace dnnkit
