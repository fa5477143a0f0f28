// Unidirectional stacks pipelined as a wavefront (one thread a layer, chunks of steps), and the rules
// that pick a sequence's time-loop schedule (rnn.h: rnn_splits_rows, rnn_uses_wavefront).
#include "steps.h"

namespace dnnkit {
namespace rnn_detail {

// ------------------------------------------------------------------------------- wavefront (forward)
// A unidirectional multi-layer RNN whose steps are too small for the threads to share one step (the
// per-step barrier and the split GEMM cost more than they save) runs as a pipeline instead: thread
// l % nw runs layer l on its own, a chunk of steps at a time, so that layer l works on chunk c while
// layer l - 1 works on chunk c + 1. A chunk's input projections are one GEMM on W_ih packed once, and
// the threads meet once per chunk rather than once per step. Every element is summed in the order the
// layer-by-layer driver uses, so the results are identical.
constexpr index_t kWaveChunks = 16;  // chunks per sequence: the pipeline fills in L - 1 of them
// Used when each layer's W_hh is small: above it, two cores sharing each step's GEMM (reading half of
// W_hh each) are faster (bench/rnn_wavefront.py; the tuner times both).
constexpr index_t kWaveMaxWhhBytes = index_t(256) << 10;

// Splitting a step by batch rows: each thread reads all of W_hh every step, which pays where W_hh stays
// in its L2 and each thread takes kRowSplitMinRows rows or more. A stack of layers pipelines as a
// wavefront instead below kRowSplitWaveRows rows a thread (bench/rnn_wavefront.py compares the three
// schedules; the tuner times them: fused_units, fused_rows, fused_wavefront).
constexpr index_t kRowSplitMinRows = 4;
constexpr index_t kRowSplitWaveRows = 8;

template <typename T>
struct WaveLayer {
  AlignedBuffer<T> xp;     // (C*B, GH) input projections of the chunk in flight
  AlignedBuffer<T> gh;     // (B, GH) one step's hidden projections
  AlignedBuffer<T> bias;   // (GH) summed input bias; (H) b_hn after it for GRU
  AlignedBuffer<T> state;  // (B, H) LSTM cell state when no reserve is kept
  AlignedBuffer<T> ap;     // h_{t-1} packed as the micro-kernel's A operand
  AlignedBuffer<T> axp;    // the chunk's inputs packed as the micro-kernel's A operand
  PackedB<T> wih;          // W_ih^T, packed once (the chunks' input projections)
  PackedB<T> whh[4];
};

template <typename T>
void rnn_forward_wavefront(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                           T* const* y, T* h_n, T* c_n, T* reserve, int nt) {
  const index_t Tn = s.seq, B = s.batch, H = s.hidden;
  const int G = rnn_gates(s.cell), L = s.layers;
  const index_t GH = G * H;
  const bool lstm = s.cell == RnnCell::lstm, gru = s.cell == RnnCell::gru;
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const index_t per_dir = rnn_reserve_elems_per_dir(s);
  const index_t C = ceil_div(Tn, kWaveChunks), chunks = ceil_div(Tn, C);
  const int nw = std::min(nt, L);

  // Whether a layer's input projections run as gemm_a_wt would run them for the whole sequence (on W_ih
  // in place: gemm_small_m or gemm_wt_direct, whose sums do not depend on the rows); otherwise on W_ih
  // packed once, by the blocked GEMM's k blocks.
  auto unpacked_ih = [&](index_t Il) {
    return Il == 0 || small_m_wins(Tn * B, GH, Il, sizeof(T)) || direct_wins<T>(Tn * B, Il);
  };
  std::vector<WaveLayer<T>> lay(static_cast<std::size_t>(L));
  AlignedBuffer<T> zeros(static_cast<std::size_t>(GH));
  std::fill(zeros.data(), zeros.data() + GH, T(0));
  for (int l = 0; l < L; ++l) {
    WaveLayer<T>& b = lay[l];
    b.xp.resize(static_cast<std::size_t>(C * B * GH));
    b.gh.resize(static_cast<std::size_t>(B * GH));
    b.bias.resize(static_cast<std::size_t>(GH + H));
    b.ap.resize(static_cast<std::size_t>(packed_a_elems(uk, B, H)));
    if (lstm && !reserve) b.state.resize(static_cast<std::size_t>(B * H));
    const T *bih = w.b_ih[l], *bhh = w.b_hh[l];
    T* bias = b.bias.data();
    for (index_t j = 0; j < GH; ++j)
      bias[j] = (bih ? bih[j] : T(0)) + (bhh && !(gru && j >= 2 * H) ? bhh[j] : T(0));
    for (index_t j = 0; j < H; ++j) bias[GH + j] = gru && bhh ? bhh[2 * H + j] : T(0);
    for (int q = 0; q < G; ++q) b.whh[q].pack(H, H, w.w_hh[l] + q * H * H, 1, H);
    const index_t Il = s.input_of(l);
    if (!unpacked_ih(Il)) {
      b.wih.pack(Il, GH, w.w_ih[l], 1, Il);
      b.axp.resize(static_cast<std::size_t>(packed_a_elems(uk, C * B, Il)));
    }
  }

  // Layer l, steps [t0, t1) on one thread: the input projections, the steps, and after the last chunk
  // the final states. What it reads of layer l - 1 was written in an earlier round.
  const StepRows step{s.cell, B, H, 0, H};
  auto run_chunk = [&](int l, index_t t0, index_t t1) {
    WaveLayer<T>& b = lay[l];
    const index_t Il = s.input_of(l);
    const T* xl = l == 0 ? x : y[l - 1];
    T* yl = y[l];
    T* save = reserve ? reserve + l * per_dir : nullptr;  // (T, B, GH) gates
    T* aux = reserve ? save + Tn * B * GH : nullptr;       // (T, B, H) c_t or W_hn h + b_hn
    const T* bhn = b.bias.data() + GH;
    // The input projections of the chunk, summed in the order the whole sequence's GEMM would use
    // (gemm_a_wt's choice for T*B rows), so that the results equal the layer-by-layer driver's.
    const index_t rows = (t1 - t0) * B;
    const T* xc = xl + t0 * B * Il;
    T* xp = b.xp.data();
    if (unpacked_ih(Il)) {
      gemm_a_wt<T>(rows, GH, Il, xc, Il, w.w_ih[l], xp, GH, b.bias.data(), T(0), 1, Tn * B);
    } else {
      pack_a_rows<T>(uk, rows, Il, xc, Il, 1, b.axp.data());
      gemm_packed_b<T>(rows, b.axp.data(), b.wih, 0, b.wih.panels(), T(0), xp, GH, false, b.bias.data());
    }
    for (index_t t = t0; t < t1; ++t) {
      const T* hprev = t == 0 ? (h0 ? h0 + l * B * H : nullptr) : yl + (t - 1) * B * H;
      const T* cprev = t == 0 ? (c0 ? c0 + l * B * H : nullptr) : (aux ? aux + (t - 1) * B * H : b.state.data());
      T* xpt = b.xp.data() + (t - t0) * B * GH;
      T* ct = aux ? aux + t * B * H : b.state.data();
      T* st = save ? save + t * B * GH : nullptr;
      T* at = aux ? aux + t * B * H : nullptr;
      if (hprev) {
        pack_a_balanced<T>(uk, B, H, hprev, H, b.ap.data());
        index_t u = 0;
        const index_t units = b.whh[0].panels() * step_row_blocks(uk.mr, B);
        fused_step<T>(step, [&] { return u < units ? u++ : index_t(-1); }, b.ap.data(), b.whh, xpt, b.gh.data(), bhn, hprev, H,
                      cprev, ct, yl + t * B * H, H, st, at, zeros.data());
      } else {
        forward_rows<T>(step, xpt, nullptr, false, bhn, hprev, H, cprev, ct, yl + t * B * H, H, st, at,
                        zeros.data());
      }
    }
    if (t1 == Tn)
      final_states<T>(step, yl + (Tn - 1) * B * H, H, aux ? aux + (Tn - 1) * B * H : b.state.data(),
                      h_n ? h_n + l * B * H : nullptr, c_n ? c_n + l * B * H : nullptr);
  };

  SpinBarrier barrier(nw);
#pragma omp parallel num_threads(nw)
  {
    const int tid = thread_id();
    for (index_t round = 0; round < chunks + L - 1; ++round) {
      for (int l = tid; l < L; l += nw) {
        const index_t c = round - l;
        if (c >= 0 && c < chunks) run_chunk(l, c * C, std::min(Tn, (c + 1) * C));
      }
      barrier.wait();  // every chunk of this round is complete before the next layer reads it
    }
  }
}


template void rnn_forward_wavefront<float>(const RnnShape&, const RnnWeights<float>&, const float*, const float*,
                                           const float*, float* const*, float*, float*, float*, int);
template void rnn_forward_wavefront<double>(const RnnShape&, const RnnWeights<double>&, const double*, const double*,
                                            const double*, double* const*, double*, double*, double*, int);

}  // namespace rnn_detail

using rnn_detail::kRowSplitMinRows;
using rnn_detail::kRowSplitWaveRows;
using rnn_detail::kWaveMaxWhhBytes;

bool rnn_splits_rows(const RnnShape& s, index_t elem_size) {
  const int threads = get_num_threads(), group = s.dirs == 2 ? threads / 2 : threads;
  if (group < 2 || s.seq < 2 || s.batch < kRowSplitMinRows * group) return false;
  if (s.schedule != RnnSchedule::automatic) return s.schedule == RnnSchedule::rows;
  return rnn_gates(s.cell) * s.hidden * s.state() * elem_size <= static_cast<index_t>(l2_cache_bytes());
}

bool rnn_uses_wavefront(const RnnShape& s, index_t elem_size) {
  const bool possible = s.dirs == 1 && s.layers >= 2 && s.seq >= 2 && s.batch > 0 && s.hidden > 0 &&
                        s.proj == 0 && get_num_threads() >= 2;
  if (!possible) return false;
  if (s.schedule != RnnSchedule::automatic) return s.schedule == RnnSchedule::wavefront;
  // Split by rows, the layers' threads never wait for each other, and every layer uses every thread
  // (2 threads, batch 16 and 64: the same time as the wavefront at 2 layers, 0.8 of it at 3).
  const int group = get_num_threads();  // one direction: every thread
  if (rnn_splits_rows(s, elem_size) && s.batch >= kRowSplitWaveRows * group) return false;
  return rnn_gates(s.cell) * s.hidden * s.hidden * elem_size <= kWaveMaxWhhBytes;
}


}  // namespace dnnkit
