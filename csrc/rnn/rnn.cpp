// Fused RNN forward and backward through time (rnn.h): the drivers, over the step machinery of steps.h.
#include "steps.h"

namespace dnnkit {
using namespace rnn_detail;

index_t rnn_reserve_elems_per_dir(const RnnShape& s) {
  const index_t tbh = s.seq * s.batch * s.hidden;
  switch (s.cell) {
    case RnnCell::lstm: return tbh * (s.proj > 0 ? 6 : 5);
    case RnnCell::gru: return tbh * 4;
    default: return 0;
  }
}

index_t rnn_reserve_elems(const RnnShape& s) {
  return rnn_reserve_elems_per_dir(s) * s.layers * s.dirs;
}

template <typename T>
void rnn_forward(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0, T* const* y,
                 T* h_n, T* c_n, T* reserve) {
  const index_t Tn = s.seq, B = s.batch, H = s.hidden, S = s.state();
  const int G = rnn_gates(s.cell), D = s.dirs;
  const index_t GH = G * H, DS = D * S;
  const bool proj = s.proj > 0;
  if (Tn == 0 || B == 0 || H == 0) return;
  if (rnn_uses_wavefront(s, sizeof(T)))
    return rnn_forward_wavefront<T>(s, w, x, h0, c0, y, h_n, c_n, reserve, get_num_threads());
  const bool lstm = s.cell == RnnCell::lstm, gru = s.cell == RnnCell::gru;
  const bool packed = Tn > 1;  // a single step multiplies W_hh once: plain GEMM, no packing
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const bool by_rows = packed && rnn_splits_rows(s, sizeof(T));
  const int nt = by_rows ? get_num_threads() : team_size(H, uk.nr, D);
  const index_t per_dir = rnn_reserve_elems_per_dir(s);
  const index_t a_elems = packed_a_elems(uk, B, std::max(H, S));  // h_{t-1} (B x S), m_t (B x H)
  const bool amx_step = packed && rnn_amx_fits<T>(s, w, h0);
  // h_{t-1} as fused_step_amx's A panels (no projection: S == H).
  const index_t amx_elems = amx_step ? ceil_div(B, index_t(amx::kBlock)) * amx::panel_elems(S) : 0;
  AlignedBuffer<amx::bf16> apack_amx(static_cast<std::size_t>(nt * amx_elems));
  AlignedBuffer<amx::bf16> hpack_amx(static_cast<std::size_t>(2 * (by_rows ? nt : D) * amx_elems));

  DirBuffers<T> buf[2];
  AlignedBuffer<T> zeros(static_cast<std::size_t>(GH));  // a zero row: h_{-1}, c_{-1} or W_hh h_{-1}
  std::fill(zeros.data(), zeros.data() + GH, T(0));
  AlignedBuffer<T> apack(static_cast<std::size_t>(nt * a_elems));
  // Without a projection, each step's post-GEMM writes h_t packed for the next step: two buffers a
  // direction, step st writing buffer st % 2 while reading the other.
  const bool h_packed = packed && !proj && !amx_step;  // (fused_step_amx packs its own)
  // Split by rows, each thread packs h_t of its own rows: two buffers a thread.
  AlignedBuffer<T> hpack(static_cast<std::size_t>(h_packed ? 2 * (by_rows ? nt : D) * a_elems : 0));
  for (int d = 0; d < D; ++d) {
    buf[d].xp.resize(static_cast<std::size_t>(Tn * B * GH));
    buf[d].gh.resize(static_cast<std::size_t>(B * GH));
    buf[d].bias.resize(static_cast<std::size_t>(GH + H));
    if (lstm && !reserve) buf[d].state.resize(static_cast<std::size_t>(B * H));
    if (proj && !reserve) buf[d].m.resize(static_cast<std::size_t>(B * H));
  }

  for (int l = 0; l < s.layers; ++l) {
    const index_t Il = s.input_of(l);
    const T* xl = l == 0 ? x : y[l - 1];
    T* yl = y[l];
    // A single step with h0 (a cell): its products and its post-GEMM in one pass, both weights read in
    // place, on the path rnn_cell_path gives (RnnCellPath); under the rule, AMX tiles first where the
    // batch fills them and x and h0 split exactly (float32).
    const bool prepacked = w.packed_ih != nullptr;
    const bool one_step = !prepacked && !packed && h0 && !proj && Il > 0;
    const RnnCellPath path = one_step ? rnn_cell_path(s, Il, sizeof(T)) : RnnCellPath::gemm;
    const bool direct_cell = path == RnnCellPath::direct;
    const bool dot_cell = path == RnnCellPath::dots;
    bool tile_cell[2] = {false, false};
    if constexpr (std::is_same_v<T, float>)
      for (int d = 0; one_step && s.cell_path == RnnCellPath::automatic && d < D; ++d)
        tile_cell[d] = cell_on_tiles(s, B, Il, xl, S, h0 + (l * D + d) * B * S);
    const bool fused_cell = direct_cell || dot_cell || tile_cell[0] || tile_cell[1];
    const bool fused_packed = fused_packed_cell_fits<T>(s, w);
    // On weights packed by the caller (see RnnWeights), a cell's two products as one; GRU keeps W_hn h
    // apart, for its reset gate.
    const bool one_product = prepacked && !gru;
    for (int d = 0; d < D; ++d) {
      const int li = l * D + d;
      DirBuffers<T>& b = buf[d];
      const T *bih = w.b_ih[li], *bhh = w.b_hh[li];
      T* bias = b.bias.data();
      for (index_t j = 0; j < GH; ++j)
        bias[j] = (bih ? bih[j] : T(0)) + (bhh && !(gru && j >= 2 * H) ? bhh[j] : T(0));
      for (index_t j = 0; j < H; ++j) bias[GH + j] = gru && bhh ? bhh[2 * H + j] : T(0);
      if (fused_packed) {
        fused_packed_cell_step<T>(s, w, xl, h0, c0, y, h_n, c_n, reserve, b, zeros.data());
      } else if (prepacked) {
        const bool both = h0 && !gru;
        gemm_prepacked<T>(B, xl, Il, *w.packed_ih, b.xp.data(), GH, bias, Activation::identity,
                          both ? h0 + li * B * S : nullptr, S, both ? w.packed_hh : nullptr);
        if (h0 && gru)
          gemm_prepacked<T>(B, h0 + li * B * S, S, *w.packed_hh, b.gh.data(), GH, nullptr, Activation::identity);
      } else if (tile_cell[d]) {
        if constexpr (std::is_same_v<T, float>)
          fused_cell_step_amx(s, w, l, d, xl, h0, c0, y, h_n, c_n, reserve, b, zeros.data());
      } else if (fused_cell) {
        fused_cell_step<T>(s, w, l, d, xl, h0, c0, y, h_n, c_n, reserve, b, zeros.data(), dot_cell);
      } else {
        gemm_a_wt<T>(Tn * B, GH, Il, xl, Il, w.w_ih[li], b.xp.data(), GH, bias, T(0));
      }
      if (packed && amx_step) {
        if constexpr (std::is_same_v<T, float>) {
          for (int q = 0; q < G; ++q) {
            b.whh_amx[q].resize(static_cast<std::size_t>(ceil_div(H, index_t(amx::kBlock)) * amx::panel_elems(S)));
            amx::pack_b_panels(S, H, w.w_hh[li] + q * H * S, 1, S, b.whh_amx[q].data(), amx::panel_elems(S));
          }
        }
      } else if (packed) {
        // Gate q's B operand: B_q(p, j) = W_hh[q*H + j, p] (S x H, read down the columns of W_hh).
        for (int q = 0; q < G; ++q) b.whh[q].pack(S, H, w.w_hh[li] + q * H * S, 1, S);
      } else if (h0 && !prepacked && !fused_cell) {
        gemm_a_wt<T>(B, GH, S, h0 + li * B * S, S, w.w_hh[li], b.gh.data(), GH, nullptr, T(0));
      }
      // The projection's B operand: B(p, j) = W_hr[j, p] (H x P).
      if (proj) b.whr.pack(H, S, w.w_hr[li], 1, H);
    }
    if (fused_cell || fused_packed) continue;  // the layer's step, final states included, is done

    SpinBarrier barriers[2] = {SpinBarrier(thread_group(0, nt, D).nt), SpinBarrier(thread_group(nt - 1, nt, D).nt)};
    // fused_step's units (fused_step_amx's: 32 x 32)
    const index_t units = amx_step ? ceil_div(H, index_t(amx::kBlock)) * ceil_div(B, index_t(amx::kBlock))
                                   : ceil_div(H, uk.nr) * step_row_blocks(uk.mr, B);
    PanelShare shares[2] = {PanelShare(thread_group(0, nt, D).nt, units), PanelShare(thread_group(nt - 1, nt, D).nt, units)};
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const int tid = thread_id();
      const ThreadGroup tg = thread_group(tid, nt, D);
      // Split by columns, the group's threads share every step (a barrier a step); split by rows, each
      // runs all hidden units of its own batch rows [r0, r1), and needs no other thread's h_t.
      const StepShare sh = step_share(by_rows, B, H, S, proj, uk.nr, tg);
      const index_t r0 = sh.r0, r1 = sh.r1;
      const Columns own = sh.own, own_s = sh.own_s;
      const StepRows step{s.cell, r1 - r0, H, own.j0, own.j1};
      const index_t own_units =
          r1 <= r0   ? 0
          : amx_step ? ceil_div(H, index_t(amx::kBlock)) * ceil_div(r1 - r0, index_t(amx::kBlock))
                     : ceil_div(H, uk.nr) * step_row_blocks(uk.mr, r1 - r0);
      std::optional<amx::TileScope> tiles;  // this thread's tile configuration
      if (amx_step) tiles.emplace();
      const int hgt = balanced_height(uk.mr, r1 - r0);  // the projection products' micro-panel height
      T* ap = apack.data() + tid * a_elems;
      index_t seq = 0;  // steps run by this group so far: which set of panel ranges the next one takes
      for (int d = tg.dir_begin; d < tg.dir_end; ++d) {
        const int li = l * D + d;
        DirBuffers<T>& b = buf[d];
        T* save = reserve ? reserve + li * per_dir : nullptr;  // (T, B, GH) gates
        T* aux = reserve ? save + Tn * B * GH : nullptr;       // (T, B, H) c_t or W_hn h + b_hn
        T* msave = reserve && proj ? aux + Tn * B * H : nullptr;  // (T, B, H) m_t (projection)
        const T* bhn = b.bias.data() + GH;
        for (index_t st = 0; st < Tn; ++st) {
          const index_t t = d == 0 ? st : Tn - 1 - st, tp = d == 0 ? t - 1 : t + 1;
          // Every operand from the thread's first row r0 on (0 unless split by rows).
          const index_t ldh = st == 0 ? S : DS;
          const T* hprev =
              st == 0 ? (h0 ? h0 + li * B * S + r0 * ldh : nullptr) : yl + tp * B * DS + d * S + r0 * ldh;
          const T* cprev = st == 0 ? (c0 ? c0 + li * B * H + r0 * H : nullptr)
                                   : (aux ? aux + tp * B * H : b.state.data()) + r0 * H;
          T* h_t = yl + t * B * DS + d * S + r0 * DS;
          // With a projection the post-GEMM writes m_t (row stride H), and h_t = m_t W_hr^T follows.
          T* m_t = proj ? (msave ? msave + t * B * H : b.m.data()) + r0 * H : nullptr;
          T* xpt = b.xp.data() + t * B * GH + r0 * GH;
          T* ct = (aux ? aux + t * B * H : b.state.data()) + r0 * H;
          T* sv = save ? save + t * B * GH + r0 * GH : nullptr;
          T* at = aux ? aux + t * B * H + r0 * H : nullptr;
          T* ght = b.gh.data() + r0 * GH;
          // h_t packed for step st + 1, and h_{t-1} as step st - 1 packed it.
          const index_t slot = 2 * (by_rows ? tid : d);
          T* const hnext = h_packed && st + 1 < Tn ? hpack.data() + (slot + (st & 1)) * a_elems : nullptr;
          const T* const hcur = h_packed && st > 0 ? hpack.data() + (slot + ((st - 1) & 1)) * a_elems : nullptr;
          amx::bf16* const hnext_amx =
              amx_step && st + 1 < Tn ? hpack_amx.data() + (slot + (st & 1)) * amx_elems : nullptr;
          const amx::bf16* const hcur_amx =
              amx_step && st > 0 ? hpack_amx.data() + (slot + ((st - 1) & 1)) * amx_elems : nullptr;
          if (hprev && packed) {
            PanelShare& share = shares[tg.group];
            const int set = static_cast<int>(seq & 1);
            // Split by rows, the thread's own units, forwards on even steps and backwards on odd ones
            // (as PanelShare runs them).
            index_t next = 0;
            auto next_unit = [&]() -> index_t {
              if (!by_rows) return share.next(set, tg.tid, set == 1);
              return next >= own_units ? -1 : set == 1 ? own_units - 1 - next++ : next++;
            };
            if (amx_step) {
              if constexpr (std::is_same_v<T, float>) {
                amx::bf16* const ax = apack_amx.data() + tid * amx_elems;
                if (!hcur_amx) pack_h_amx(step.B, S, hprev, ldh, ax);
                amx::bf16* const whq[4] = {b.whh_amx[0].data(), b.whh_amx[1].data(), b.whh_amx[2].data(),
                                           b.whh_amx[3].data()};
                fused_step_amx(step, next_unit, hcur_amx ? hcur_amx : ax, whq, S, xpt, ght, bhn, hprev, ldh, cprev,
                               ct, h_t, DS, sv, at, zeros.data(), hnext_amx);
              }
            } else {
              if (!hcur) pack_a_balanced<T>(uk, step.B, S, hprev, ldh, ap);
              fused_step<T>(step, next_unit, hcur ? hcur : ap, b.whh, xpt, ght, bhn, hprev, ldh, cprev, ct,
                            proj ? m_t : h_t, proj ? H : DS, sv, at, zeros.data(), hnext);
            }
          } else {
            // A single step (its products by plain GEMM: into gh, or with x's into xp, GRU's gate n
            // into gh) or h_{t-1} = 0.
            const bool summed = one_product;
            forward_rows<T>(step, xpt, hprev && !one_product ? ght : nullptr, summed, bhn, hprev, ldh, cprev, ct,
                            proj ? m_t : h_t, proj ? H : DS, sv, at, zeros.data());
            if (hnext) pack_a_balanced<T>(uk.mr, step.B, S, h_t, DS, hnext, 0, step.B, own.j0, own.j1);
            if constexpr (std::is_same_v<T, float>) {
              // own.j0 and own.j1 are multiples of NR, 32 on AVX-512 (float32): whole depth steps.
              if (hnext_amx) pack_h_amx(step.B, S, h_t, DS, hnext_amx, own.j0, own.j1);
            }
          }
          if (proj) {
            if (!by_rows) barriers[tg.group].wait();  // m_t complete before any thread packs it
            pack_a_rows<T>(uk, step.B, H, m_t, H, 1, ap, hgt);
            gemm_packed_b<T>(step.B, ap, b.whr, own_s.c0, own_s.c1, T(0), h_t, DS, false, nullptr, hgt);
          }
          if (packed) {
            ++seq;
            if (!by_rows) shares[tg.group].reset(static_cast<int>(seq & 1), tg.tid);  // see PanelShare
          }
          // h_t (and its packing) complete before the next step reads it: other threads' rows of it
          // unless split by rows.
          if (!by_rows) barriers[tg.group].wait();
        }
        // Final states of the owned rows and columns: h_n (S wide) and c_n (H wide).
        const index_t t_last = d == 0 ? Tn - 1 : 0;
        const T* h_last = yl + t_last * B * DS + d * S;
        const T* c_last = aux ? aux + t_last * B * H : b.state.data();
        for (index_t r = r0; r < r1; ++r) {
          if (h_n) std::copy(h_last + r * DS + own_s.j0, h_last + r * DS + own_s.j1, h_n + (li * B + r) * S + own_s.j0);
          if (c_n && lstm)
            std::copy(c_last + r * H + own.j0, c_last + r * H + own.j1, c_n + (li * B + r) * H + own.j0);
        }
      }
    }
  }
}

// H_prev of a layer's direction as a GEMM's B operand (GemmArgs::pack_b), TB x S: the rows of step t hold
// h_{t-1} (forward) or h_{t+1} (reverse) from the layer's output y (row stride ldy), those of the step that
// read the initial state (t_first) h0, or zeros without one.
template <typename T>
struct HPrevRows {
  index_t batch, S, ldy;
  const T* y;   // the direction's first column of the layer output
  const T* h0;  // (batch x S), or null
  index_t t_first;
  bool forward;
};

template <typename T>
void pack_h_prev(const void* ctx, index_t pc, index_t kc, index_t j, index_t n_t, int nr, T* dst) {
  const HPrevRows<T>& h = *static_cast<const HPrevRows<T>*>(ctx);
  for (index_t p = 0; p < kc; ++p) {
    const index_t r = pc + p, t = r / h.batch, b = r % h.batch;
    const T* src = t == h.t_first ? (h.h0 ? h.h0 + b * h.S : nullptr)
                                  : h.y + ((h.forward ? t - 1 : t + 1) * h.batch + b) * h.ldy;
    T* out = dst + p * nr;
    if (src)
      std::copy(src + j, src + j + n_t, out);
    else
      std::fill(out, out + n_t, T(0));
    std::fill(out + n_t, out + nr, T(0));
  }
}

template <typename T>
void rnn_backward(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                  const T* const* y, const T* reserve, const T* dy, const T* dh_n, const T* dc_n, T* dx, T* dh0,
                  T* dc0, const RnnWeightGrads<T>& dw) {
  const index_t Tn = s.seq, B = s.batch, H = s.hidden, S = s.state(), TB = s.seq * s.batch;
  const int G = rnn_gates(s.cell), D = s.dirs, L = s.layers;
  const index_t GH = G * H, DS = D * S;
  const bool lstm = s.cell == RnnCell::lstm, gru = s.cell == RnnCell::gru, relu = s.cell == RnnCell::rnn_relu;
  const bool proj = s.proj > 0;
  const bool packed = Tn > 1;
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  // Split by rows (rnn_splits_rows), each thread runs its own batch rows through every step, all hidden
  // units, with no barrier; split by hidden units, the threads of a direction meet twice a step.
  const bool by_rows = packed && rnn_splits_rows(s, sizeof(T));
  const int nt = by_rows ? get_num_threads() : team_size(H, uk.nr, D);
  const index_t per_dir = rnn_reserve_elems_per_dir(s);
  const GateKernels<T>* vk = gate_kernels<T>();  // null: the portable loops above

  DirBuffers<T> buf[2];
  const index_t zlen = std::max<index_t>(D * std::max(H, S), 1);
  AlignedBuffer<T> zeros(static_cast<std::size_t>(zlen));
  std::fill(zeros.data(), zeros.data() + zlen, T(0));
  // dG_t packed once a step, each thread of a direction's group packing a share of its panels (split
  // by rows: each thread its own rows, into its own buffer).
  const index_t a_elems = packed_a_elems(uk, B, GH);
  AlignedBuffer<T> apack(static_cast<std::size_t>((by_rows ? nt : D) * a_elems));
  // With a projection, each thread packs dh_t (B x P) itself for dm_t = dh_t W_hr.
  const index_t p_elems = proj ? packed_a_elems(uk, B, S) : 0;
  AlignedBuffer<T> ppack(static_cast<std::size_t>(nt * p_elems));
  AlignedBuffer<T> dybuf[2];  // gradients of intermediate layer outputs, (T, B, DS), ping-pong
  for (int i = 0; i < (L > 1 ? std::min(L - 1, 2) : 0); ++i) dybuf[i].resize(static_cast<std::size_t>(TB * DS));
  for (int d = 0; d < D; ++d) {
    buf[d].state.resize(static_cast<std::size_t>(std::max<index_t>(B * S, 1)));
    if (lstm) buf[d].dstate.resize(static_cast<std::size_t>(std::max<index_t>(B * H, 1)));
    buf[d].dg.resize(static_cast<std::size_t>(std::max<index_t>(TB * GH, 1)));
    if (gru) buf[d].dgh.resize(static_cast<std::size_t>(std::max<index_t>(TB * GH, 1)));
    if (proj) {
      buf[d].m.resize(static_cast<std::size_t>(std::max<index_t>(B * H, 1)));
      buf[d].dh.resize(static_cast<std::size_t>(std::max<index_t>(TB * S, 1)));
    }
  }

  for (int l = L - 1; l >= 0; --l) {
    const index_t Il = s.input_of(l);
    const T* xl = l == 0 ? x : y[l - 1];
    const T* yl = y[l];
    const T* dyl = l == L - 1 ? dy : dybuf[l % 2].data();
    T* dxl = l == 0 ? dx : dybuf[(l - 1) % 2].data();
    for (int d = 0; d < D; ++d) {
      const int li = l * D + d;
      DirBuffers<T>& b = buf[d];
      if (dh_n)
        std::copy(dh_n + li * B * S, dh_n + (li + 1) * B * S, b.state.data());
      else
        std::fill(b.state.data(), b.state.data() + B * S, T(0));
      if (lstm) {
        if (dc_n)
          std::copy(dc_n + li * B * H, dc_n + (li + 1) * B * H, b.dstate.data());
        else
          std::fill(b.dstate.data(), b.dstate.data() + B * H, T(0));
      }
      // dh_{t-1} (B x S) = dG_t (B x GH) W_hh (GH x S): W_hh is already k-major.
      if (packed) b.whh[0].pack(GH, S, w.w_hh[li], S, 1);
      // dm_t (B x H) = dh_t (B x P) W_hr (P x H).
      if (proj) b.whr.pack(S, H, w.w_hr[li], H, 1);
    }

    SpinBarrier barriers[2] = {SpinBarrier(thread_group(0, nt, D).nt), SpinBarrier(thread_group(nt - 1, nt, D).nt)};
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const int tid = thread_id();
      const ThreadGroup tg = thread_group(tid, nt, D);
      // The thread's rows [r0, r1) (all of them unless split by rows) and columns.
      const StepShare sh = step_share(by_rows, B, H, S, proj, uk.nr, tg);
      const index_t r0 = sh.r0, r1 = sh.r1, Bs = r1 - r0;
      const Columns own = sh.own, own_s = sh.own_s;
      const int hgt = balanced_height(uk.mr, Bs);  // the micro-panels' height for those rows
      T* ap = apack.data() + (by_rows ? tid : tg.group) * a_elems;
      T* pp = ppack.data() + tid * p_elems;
      for (int d = tg.dir_begin; d < tg.dir_end; ++d) {
        const int li = l * D + d;
        DirBuffers<T>& b = buf[d];
        const T* save = reserve + li * per_dir;
        const T* aux = save + TB * GH;
        T* dgh_all = gru ? b.dgh.data() : b.dg.data();
        for (index_t st = Tn - 1; st >= 0; --st) {
          const index_t t = d == 0 ? st : Tn - 1 - st, tp = d == 0 ? t - 1 : t + 1;
          if (proj) {
            // dh_t = dy_t + (the gradient from step t+1), owned P columns, kept for dW_hr; then, once all
            // of it is there, dm_t = dh_t W_hr: the gradient the cell's output m_t receives.
            T* dh_t = b.dh.data() + t * B * S;
            for (index_t r = r0; r < r1; ++r) {
              const T* dyr = dyl ? dyl + (t * B + r) * DS + d * S : zeros.data();
              const T* dhr = b.state.data() + r * S;
              for (index_t j = own_s.j0; j < own_s.j1; ++j) dh_t[r * S + j] = dyr[j] + dhr[j];
            }
            if (!by_rows) barriers[tg.group].wait();  // dh_t complete before any thread packs it
            pack_a_rows<T>(uk, Bs, S, dh_t + r0 * S, S, 1, pp, hgt);
            gemm_packed_b<T>(Bs, pp, b.whr, own.c0, own.c1, T(0), b.m.data() + r0 * H, H, false, nullptr, hgt);
          }
          for (index_t r = r0; r < r1; ++r) {
            const index_t row = t * B + r;
            // With a projection the cell sees dm_t (in place of dy + dhr, whose sum is already in it).
            const T* dyr = proj ? b.m.data() + r * H : (dyl ? dyl + row * DS + d * S : zeros.data());
            const T* dhr = proj ? zeros.data() : b.state.data() + r * S;
            T* dg = b.dg.data() + row * GH;
            if (lstm) {
              const T* cp = st == 0 ? (c0 ? c0 + (li * B + r) * H : zeros.data()) : aux + (tp * B + r) * H;
              if (vk) {
                vk->lstm_bwd(H, own.j0, own.j1, dyr, dhr, save + row * GH, aux + row * H, cp, b.dstate.data() + r * H,
                             dg);
                continue;
              }
              lstm_bwd<T>(H, own.j0, own.j1, dyr, dhr, save + row * GH, aux + row * H, cp,
                          b.dstate.data() + r * H, dg);
            } else if (gru) {
              T* dhw = b.state.data() + r * S;
              const T* hp = st == 0 ? (h0 ? h0 + (li * B + r) * H : zeros.data()) : yl + (tp * B + r) * DS + d * H;
              gru_bwd<T>(H, own.j0, own.j1, dyr, dhw, save + row * GH, aux + row * H, hp, dg,
                         b.dgh.data() + row * GH);
            } else {
              rnn_bwd<T>(relu, own.j0, own.j1, dyr, dhr, yl + row * DS + d * H, dg);
            }
          }
          if (by_rows) {
            // The thread's rows of dG_t packed, and its rows of dh_{t-1}.
            pack_a_rows<T>(uk, Bs, GH, dgh_all + (t * B + r0) * GH, GH, 1, ap, hgt);
            gemm_packed_b<T>(Bs, ap, b.whh[0], own_s.c0, own_s.c1, gru ? T(1) : T(0), b.state.data() + r0 * S, S,
                             (st & 1) != 0, nullptr, hgt);  // alternate directions: see gemm_packed_b
            continue;
          }
          barriers[tg.group].wait();  // dG_t complete before any thread packs it
          if (packed) {
            // The group packs dG_t together into one buffer. It is free: every thread of the group
            // passed the barrier above after its last step's products.
            // Micro-panels of balanced height (B16 on a 14-row kernel: 8 + 8 rows, not 14 + 2).
            pack_a_rows_part<T>(uk, B, GH, dgh_all + t * B * GH, GH, 1, ap, tg.tid, tg.nt, hgt);
            if (tg.nt > 1) barriers[tg.group].wait();  // packed dG_t complete before the products
            gemm_packed_b<T>(B, ap, b.whh[0], own_s.c0, own_s.c1, gru ? T(1) : T(0), b.state.data(), S,
                             (st & 1) != 0, nullptr, hgt);  // alternate directions: see gemm_packed_b
          }
        }
      }
    }

    for (int d = 0; d < D; ++d) {
      const int li = l * D + d;
      DirBuffers<T>& b = buf[d];
      const T* dgx = b.dg.data();
      const T* dgh = gru ? b.dgh.data() : b.dg.data();
      const index_t t_first = d == 0 ? 0 : Tn - 1;  // the step that read h0
      const T wbeta = dw.accumulate ? T(1) : T(0);  // the weight gradients' beta
      if (!packed)  // one step: dh0 = dG_0 W_hh, unpacked
        gemm_strided<T>(B, S, GH, dgh, GH, 1, w.w_hh[li], S, 1, b.state.data(), S, gru ? T(1) : T(0));
      if (dh0) std::copy(b.state.data(), b.state.data() + B * S, dh0 + li * B * S);
      if (lstm && dc0) std::copy(b.dstate.data(), b.dstate.data() + B * H, dc0 + li * B * H);
      // A cell at a batch of at most kStreamDepth: each weight gradient in one pass of gemm_stream's
      // rank-k update, which the shared packing below would send to the blocked GEMM.
      const bool streamed = Tn == 1 && B <= kStreamDepth;
      if (dgh == dgx && !streamed) {
        // dW_ih (GH x Il) = dG^T (GH x TB) X_l (TB x Il) and dW_hh (GH x S) = dG^T H_prev, H_prev's rows
        // of step t holding h_{t-1} (HPrevRows): one packing of dG^T for both products.
        AlignedBuffer<T> dgt(static_cast<std::size_t>(packed_a_blocks_elems<T>(GH, TB)));
        pack_a_blocks<T>(GH, TB, dgx, 1, GH, dgt.data(), get_num_threads());
        GemmArgs<T> gi = strided_gemm_args<T>(GH, Il, TB, dgx, 1, GH, xl, Il, 1, dw.w_ih[li], Il, wbeta);
        gi.a_packed = dgt.data();
        gemm<T>(gi);
        const HPrevRows<T> hp{B, S, DS, yl + d * S, h0 ? h0 + li * B * S : nullptr, t_first, d == 0};
        GemmArgs<T> gh = strided_gemm_args<T>(GH, S, TB, dgx, 1, GH, nullptr, 0, 0, dw.w_hh[li], S, wbeta);
        gh.a_packed = dgt.data();
        gh.pack_b = pack_h_prev<T>;
        gh.pack_b_ctx = &hp;
        gemm<T>(gh);
      } else {
        // dW_ih (GH x Il) = dGx^T (GH x TB) X_l (TB x Il)
        gemm_strided<T>(GH, Il, TB, dgx, 1, GH, xl, Il, 1, dw.w_ih[li], Il, wbeta);
        // dW_hh (GH x S) = sum over steps of dGh_t^T h_{t-1}: the steps after the first read the layer
        // output one step back (forward direction) or ahead (reverse); the first reads h0.
        const index_t k_steps = (Tn - 1) * B;
        const T* dgh_later = d == 0 ? dgh + B * GH : dgh;
        const T* h_prev = d == 0 ? yl + d * S : yl + B * DS + d * S;
        // (One step with h0: the h0 product alone, in one pass over dW_hh.)
        const bool h0_only = k_steps == 0 && h0;
        if (!h0_only) gemm_strided<T>(GH, S, k_steps, dgh_later, 1, GH, h_prev, DS, 1, dw.w_hh[li], S, wbeta);
        if (h0)
          gemm_strided<T>(GH, S, B, dgh + t_first * B * GH, 1, GH, h0 + li * B * S, S, 1, dw.w_hh[li], S,
                          h0_only ? wbeta : T(1));
      }
      // dW_hr (P x H) = dH^T (P x TB) M (TB x H), M the saved m_t.
      if (proj)
        gemm_strided<T>(S, H, TB, b.dh.data(), 1, S, reserve + li * per_dir + TB * (GH + H), H, 1, dw.w_hr[li], H,
                        wbeta);
      if (dgh == dgx && dw.b_ih[li] && dw.b_hh[li]) {  // both biases see the same gate gradients (all but GRU)
        column_sums<T>(dgx, TB, GH, dw.b_ih[li], dw.accumulate, dw.b_hh[li]);
      } else {
        if (dw.b_ih[li]) column_sums<T>(dgx, TB, GH, dw.b_ih[li], dw.accumulate);
        if (dw.b_hh[li]) column_sums<T>(dgh, TB, GH, dw.b_hh[li], dw.accumulate);
      }
      // dX_l (TB x Il) = sum_d dGx_d (TB x GH) W_ih_d (GH x Il)
      gemm_strided<T>(TB, Il, GH, dgx, GH, 1, w.w_ih[li], Il, 1, dxl, Il, d == 0 ? T(0) : T(1));
    }
  }
}

template void rnn_forward<float>(const RnnShape&, const RnnWeights<float>&, const float*, const float*, const float*,
                                 float* const*, float*, float*, float*);
template void rnn_forward<double>(const RnnShape&, const RnnWeights<double>&, const double*, const double*,
                                  const double*, double* const*, double*, double*, double*);
template void rnn_backward<float>(const RnnShape&, const RnnWeights<float>&, const float*, const float*, const float*,
                                  const float* const*, const float*, const float*, const float*, const float*, float*,
                                  float*, float*, const RnnWeightGrads<float>&);
template void rnn_backward<double>(const RnnShape&, const RnnWeights<double>&, const double*, const double*,
                                   const double*, const double* const*, const double*, const double*, const double*,
                                   const double*, double*, double*, double*, const RnnWeightGrads<double>&);

}  // namespace dnnkit
