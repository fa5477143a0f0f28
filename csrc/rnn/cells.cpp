// A single step from given states (a cell, or a sequence of one step): its products and post-GEMM in
// one pass on the strided-A kernel, the dot products, AMX tiles, or weights packed by pack_weight; and
// whether a sequence's recurrent products run on AMX tiles.
#include "steps.h"

namespace dnnkit {
namespace rnn_detail {

// every gate by gemm_wt_direct_cell (or, with `dots`, gemm_small_m_cell), and for each block of hidden units the post-GEMM and the final
// states on the thread that computed its pre-activations. b.bias holds the summed biases (and GRU's b_hn).
template <typename T>
void fused_cell_step(const RnnShape& s, const RnnWeights<T>& w, int l, int d, const T* xl, const T* h0, const T* c0,
                     T* const* y, T* h_n, T* c_n, T* reserve, DirBuffers<T>& b, const T* zeros, bool dots) {
  const index_t B = s.batch, H = s.hidden, S = s.state(), Il = s.input_of(l);
  const int G = rnn_gates(s.cell), li = l * s.dirs + d;
  const index_t GH = G * H;
  const bool gru = s.cell == RnnCell::gru;
  T* const save = reserve ? reserve + li * rnn_reserve_elems_per_dir(s) : nullptr;  // (1, B, GH) gates
  T* const aux = reserve ? save + B * GH : nullptr;  // (1, B, H) c_t or W_hn h + b_hn
  struct Ctx {
    StepRows step;
    const T *xp, *gh, *bhn, *hprev, *cprev, *zeros;
    T *c, *h, *save, *aux, *h_n, *c_n;
    index_t ldy;
  } ctx{{s.cell, B, H, 0, 0}, b.xp.data(), gru ? b.gh.data() : nullptr, b.bias.data() + GH, h0 + li * B * S,
        c0 ? c0 + li * B * H : nullptr, zeros, nullptr, y[l] + d * S, save, aux,
        h_n ? h_n + li * B * S : nullptr, c_n ? c_n + li * B * H : nullptr,
        index_t(s.dirs) * S};
  // c_t goes to the reserve in training; in inference straight into c_n (no copy), else to scratch.
  ctx.c = aux ? aux : (ctx.c_n ? ctx.c_n : b.state.data());
  if (ctx.c == ctx.c_n) ctx.c_n = nullptr;
  CellDone done = [](void* p, index_t j0, index_t j1) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    StepRows step = c.step;
    step.j0 = j0;
    step.j1 = j1;
    forward_rows<T>(step, c.xp, c.gh, true, c.bhn, c.hprev, step.H, c.cprev, c.c, c.h, c.ldy, c.save, c.aux, c.zeros);
    final_states<T>(step, c.h, c.ldy, c.c, c.h_n, c.c_n);
  };
  // Gate q's rows of W_ih and W_hh into column block q of xp, with its bias; GRU's gate n from the
  // input apart from gate n from h (into gh), which the reset gate scales.
  const T *wih = w.w_ih[li], *whh = w.w_hh[li], *bias = b.bias.data();
  T* xp = b.xp.data();
  CellGroup<T> groups[4];
  int ng = 0;
  for (int q = 0; q < G; ++q) {
    if (gru && q == 2) break;
    groups[ng++] = {wih + q * H * Il, Il, whh + q * H * S, S, xp + q * H, GH, bias + q * H};
  }
  if (gru) {
    groups[ng++] = {wih + 2 * H * Il, Il, nullptr, S, xp + 2 * H, GH, bias + 2 * H};
    groups[ng++] = {nullptr, Il, whh + 2 * H * S, S, b.gh.data() + 2 * H, GH, nullptr};
  }
  if (dots)
    gemm_small_m_cell<T>(B, H, Il, xl, Il, S, h0 + li * B * S, S, groups, ng, done, &ctx);
  else
    gemm_wt_direct_cell<T>(B, H, Il, xl, Il, S, h0 + li * B * S, S, groups, ng, done, &ctx);
}

// Where a cell's outputs go (one layer-direction: reserve and c_n already at its part, or null): the
// gates and c_t (or W_hn h + b_hn) to the reserve in training; in inference c_t straight into c_n (then
// not copied again), else to scratch. And its threads: no more than its panels of hidden units, one for
// a small product (depth: the product's, I + S).
template <typename T>
struct CellOut {
  T *save, *aux, *c, *c_n;
  int nt;
};
template <typename T>
CellOut<T> cell_out(const RnnShape& s, index_t panels, index_t depth, T* c_n, T* reserve, DirBuffers<T>& b) {
  const index_t GH = rnn_gates(s.cell) * s.hidden;
  CellOut<T> o;
  o.save = reserve;                                     // (1, B, GH) gates
  o.aux = reserve ? o.save + s.batch * GH : nullptr;  // (1, B, H) c_t or W_hn h + b_hn
  o.c = o.aux ? o.aux : (c_n ? c_n : b.state.data());
  o.c_n = o.c == c_n ? nullptr : c_n;
  o.nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(get_num_threads(), panels)));
  if (double(s.batch) * double(GH) * double(depth) < min_parallel_work()) o.nt = 1;
  return o;
}

// fn(hx, ip, i, rows) for each 32-row panel ip of a cell's x (hx false) and then h0's (hx true), rows
// [i, i + rows) of B, dealt to the threads of the region in turn; the caller's barrier follows.
template <class F>
void for_each_xh_panel(index_t B, F&& fn) {
  const index_t panels = ceil_div(B, index_t(amx::kBlock));
  for (index_t u = thread_id(); u < 2 * panels; u += thread_count()) {
    const bool hx = u >= panels;
    const index_t ip = hx ? u - panels : u, i = ip * amx::kBlock;
    fn(hx, ip, i, static_cast<int>(std::min<index_t>(amx::kBlock, B - i)));
  }
}

// A float32 cell on weights in place on AMX tiles, the weights as the A operand: the product is C^T =
// W [x | h]^T, so that 32 rows of a weight become an A panel by the split alone (the tile unit's A is
// row-major in depth, as W is), where as the B operand every 16 x 16 block of them would also be
// transposed; x and h, a few rows, are packed once as B panels and stay in L2. The split of the weights
// at every call (read from L3 and written to L2 as three parts) runs between the tile products
// (fused_cell_step_amx) and is repaid by the batch from 64 rows where I + H >= 512, from 96 below
// (bench/cell_tiles.py against the FMA kernels). A batch whose B panels pass 3/4 of L2 stays on the
// FMA kernels or the blocked GEMM.
bool cell_on_tiles(const RnnShape& s, index_t B, index_t I, const float* x, index_t S, const float* h0) {
  if (!rnn_tiles_active(s) || !h0) return false;
  if (s.tiles == RnnTiles::automatic) {
    if (B < 64 || (I + S < 512 && B < 96)) return false;
    const double panel_bytes = double(ceil_div(B, index_t(amx::kBlock))) *
                               double(amx::panel_elems(I) + amx::panel_elems(S)) * sizeof(amx::bf16);
    if (panel_bytes > 0.75 * double(l2_cache_bytes())) return false;
  }
  return amx::splittable(B, I, x, I, 1) && amx::splittable(B, S, h0, S, 1);
}

// fused_cell_step on the tiles (cell_on_tiles): for each block of 32 hidden units, gate by gate, the
// gate's 32 rows of W_ih and W_hh split into one thread's A panels, then for each 32-row panel of the
// batch one tile summing W_ih x^T and W_hh h^T from the bias (GRU's gate n: the two apart, h's into gh),
// stored batch-major into xp; then the post-GEMM and final states of the block. Each gate's split runs
// between the tile products of the gate before (amx::SplitQueue; the next block's first gate during
// this one's last), into a second copy of the panels; where two copies do not fit in L2 beside the B
// panels, the gate runs in halves instead, W_ih's tiles while W_hh's rows are split and W_hh's (started
// from the tile W_ih's stored) while the next W_ih's are (bench/cell_tiles.py). A block whose weights
// do not split exactly runs on the FMA dot products instead (gemm_small_m; the block alone: the outputs
// are float32's either way).
void fused_cell_step_amx(const RnnShape& s, const RnnWeights<float>& w, int l, int d, const float* xl,
                         const float* h0, const float* c0, float* const* y, float* h_n, float* c_n, float* reserve,
                         DirBuffers<float>& b, const float* zeros) {
  const index_t B = s.batch, H = s.hidden, S = s.state(), I = s.input_of(l);
  const int G = rnn_gates(s.cell), li = l * s.dirs + d;
  const index_t GH = G * H, ldy = index_t(s.dirs) * S;
  const bool gru = s.cell == RnnCell::gru;
  const float* const hp = h0 + li * B * S;
  const float* const cp = c0 ? c0 + li * B * H : nullptr;
  float* const h = y[l] + d * S;
  float* const hn = h_n ? h_n + li * B * S : nullptr;
  const index_t units = ceil_div(H, index_t(amx::kBlock)), batch_panels = ceil_div(B, index_t(amx::kBlock));
  const CellOut<float> o = cell_out(s, units, I + S, c_n ? c_n + li * B * H : nullptr,
                                    reserve ? reserve + li * rnn_reserve_elems_per_dir(s) : nullptr, b);
  float *const save = o.save, *const aux = o.aux, *const c = o.c, *const cn = o.c_n;
  const int nt = o.nt;
  const float *const wih = w.w_ih[li], *const whh = w.w_hh[li], *const bias = b.bias.data();
  float *const xp = b.xp.data(), *const gh = b.gh.data();
  const index_t pe_x = amx::panel_elems(I), pe_h = amx::panel_elems(S), ns_x = amx::steps(I), ns_h = amx::steps(S);
  AlignedBuffer<amx::bf16> bpanels(static_cast<std::size_t>(batch_panels * (pe_x + pe_h)));  // x^T, h^T
  // A gate's W_ih and W_hh rows, twice where two copies and the B panels fit in 3/5 of L2 (the next gate
  // split while the tiles run this one's, one tile for both products), else once (the halves in turn).
  const index_t pe_a = pe_x + pe_h;
  const bool halves =
      double((2 + batch_panels) * pe_a) * sizeof(amx::bf16) > 0.6 * double(l2_cache_bytes());
  AlignedBuffer<amx::bf16> apanels(static_cast<std::size_t>(nt * (halves ? 1 : 2) * pe_a));
  amx::bf16 *const bx = bpanels.data(), *const bh = bx + batch_panels * pe_x;
  std::optional<PanelShare> share;
  if (nt > 1) share.emplace(nt, units);
  const bool reverse = alternate_direction(wih);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = thread_id();
    for_each_xh_panel(B, [&](bool hx, index_t ip, index_t i, int cols) {  // x^T and h0^T as B panels
      if (hx)
        amx::pack_b_panel(S, cols, hp + i * S, 1, S, bh + ip * pe_h);
      else
        amx::pack_b_panel(I, cols, xl + i * I, 1, I, bx + ip * pe_x);
    });
#pragma omp barrier
    const amx::TileScope tiles;
    amx::bf16* const abuf = apanels.data() + tid * (halves ? 1 : 2) * pe_a;
    amx::SplitQueue queue;
    // Item t of a block: gate t's products (panels at slot 0 and 1 in turn); with `halves`, gate t / 2's
    // W_ih products (t even) or W_hh products (t odd), from slot 0's W_ih and W_hh panels. The rows of
    // the item after are split while the tiles run this one's (the next block's first: asked for early).
    auto queue_item = [&](index_t jp, int t, int slot) {
      const index_t j0 = jp * amx::kBlock, row = (halves ? t / 2 : t) * H + j0;
      const int n_u = static_cast<int>(std::min<index_t>(amx::kBlock, H - j0));
      amx::bf16* const a = abuf + slot * pe_a;
      if (!halves || t % 2 == 0) queue.add(n_u, I, wih + row * I, I, a);
      if (!halves || t % 2 == 1) queue.add(n_u, S, whh + row * S, S, a + pe_x);
    };
    const int items = halves ? 2 * G : G;
    UnitCursor cursor(share ? &*share : nullptr, units, reverse);
    index_t jp = cursor.next();
    int slot = 0;
    bool item_ok = true;
    if (jp >= 0) {  // the first item's split alone
      queue_item(jp, 0, slot);
      item_ok = queue.finish();
    }
    while (jp >= 0) {
      const index_t j0 = jp * amx::kBlock;
      const int n_u = static_cast<int>(std::min<index_t>(amx::kBlock, H - j0));
      bool split = true;
      index_t next = -1;
      for (int t = 0; t < items; ++t) {
        split = split && item_ok;
        const int to = halves ? 0 : slot ^ 1;
        queue.clear();
        if (t + 1 < items)
          queue_item(jp, t + 1, to);
        else if ((next = cursor.next()) >= 0)
          queue_item(next, 0, to);
        const int q = halves ? t / 2 : t;
        const bool ih = !halves || t % 2 == 0, hh = !halves || t % 2 == 1;
        const bool apart = gru && q == 2;  // GRU's gate n: W_hn h apart, into gh, which the reset gate scales
        // Row steps of the split to run after every four tile products, so that it ends with them.
        const int side =
            static_cast<int>(ceil_div(queue.left(), 6 * batch_panels * ((ih ? ns_x : 0) + (hh ? ns_h : 0))));
        const amx::bf16 *const aih = abuf + slot * pe_a, *const ahh = aih + pe_x;
        const index_t row = q * H + j0;
        for (index_t ip = 0; split && ip < batch_panels; ++ip) {
          const index_t i = ip * amx::kBlock;
          const int m_b = static_cast<int>(std::min<index_t>(amx::kBlock, B - i));
          float* const xq = xp + i * GH + row;
          if (ih && hh && !apart) {
            amx::tile_t(ns_x, aih, bx + ip * pe_x, xq, GH, n_u, m_b, bias + row, ns_h, ahh, bh + ip * pe_h, &queue,
                        side);
            continue;
          }
          if (ih) amx::tile_t(ns_x, aih, bx + ip * pe_x, xq, GH, n_u, m_b, bias + row, 0, nullptr, nullptr, &queue, side);
          if (hh)  // onto W_ih's sum (float32, stored and loaded back exactly: the same bits), or into gh
            amx::tile_t(ns_h, ahh, bh + ip * pe_h, apart ? gh + i * GH + row : xq, GH, n_u, m_b, nullptr, 0, nullptr,
                        nullptr, &queue, side, !apart);
        }
        item_ok = queue.finish();
        slot = to;
      }
      if (!split) {  // every gate of the block again, on the FMA dot products (no workspace, this thread)
        for (int q = 0; q < G; ++q) {
          const index_t row = q * H + j0;
          const bool apart = gru && q == 2;
          GemmArgs<float> g = strided_gemm_args<float>(B, n_u, I, xl, I, 1, wih + row * I, 1, I, xp + row, GH, 0.f);
          g.bias = bias + row;
          gemm_small_m<float>(g, 1);
          g = strided_gemm_args<float>(B, n_u, S, hp, S, 1, whh + row * S, 1, S, (apart ? gh : xp) + row, GH,
                                       apart ? 0.f : 1.f);
          gemm_small_m<float>(g, 1);
        }
      }
      const StepRows step{s.cell, B, H, j0, j0 + n_u};
      forward_rows<float>(step, xp, gru ? gh : nullptr, true, bias + GH, hp, S, cp, c, h, ldy, save, aux, zeros);
      final_states<float>(step, h, ldy, c, hn, cn);
      jp = next;
    }
  }
}

// A cell on weights packed by the caller (RnnWeights::packed_ih, packed_hh) whose gates' blocks of NR
// hidden units are whole panels (H a multiple of NR) and whose batch is one block of rows, as
// gemm_prepacked takes it: for each block of NR hidden units, every gate's products (x W_ih^T, then
// h W_hh^T added and the bias in the last store; GRU's W_hn h apart, into gh) and then the post-GEMM
// and final states, on one thread, as fused_cell_step does on weights in place.
template <typename T>
bool fused_packed_cell_fits(const RnnShape& s, const RnnWeights<T>& w) {
  if (!w.packed_ih || s.proj > 0 || s.seq != 1 || s.layers != 1 || s.dirs != 1) return false;
  const UKernel<T>& uk = w.packed_ih->ukernel();
  return s.hidden % uk.nr == 0 && s.batch <= std::max(uk.mr, 256 / uk.mr * uk.mr) && s.input > 0 &&
         w.packed_hh->ukernel().fn == uk.fn;
}

// fused_packed_cell_step on AMX tiles (float32): both weights packed a second time into bfloat16 parts
// (PackedB::pack_amx), a batch that fills 3/4 of a 32-row tile or more, x and h0 split exactly. x and h0
// packed once as tile panels; for each 32-unit panel of hidden units, every row panel's gate tiles sum x
// W_ih^T and h W_hh^T (GRU's gate n: the two apart, h's into gh) with the bias, one load and store of
// the tiles each, then the post-GEMM.
bool packed_cell_on_tiles(const RnnShape& s, const RnnWeights<float>& w, const float* x, const float* h0) {
  if (!rnn_tiles_active(s) || !w.packed_ih->amx_panel(0) || !w.packed_hh->amx_panel(0) || !h0 ||
      (s.tiles == RnnTiles::automatic && 4 * s.batch < 3 * amx::kBlock))
    return false;
  return amx::splittable(s.batch, s.input, x, s.input, 1) && amx::splittable(s.batch, s.hidden, h0, s.hidden, 1);
}

void fused_packed_cell_step_amx(const RnnShape& s, const RnnWeights<float>& w, const float* x, const float* h0,
                                const float* c0, float* const* y, float* h_n, float* c_n, float* reserve,
                                DirBuffers<float>& b, const float* zeros) {
  const index_t B = s.batch, H = s.hidden, I = s.input;
  const int G = rnn_gates(s.cell);
  const index_t GH = G * H;
  const bool gru = s.cell == RnnCell::gru;
  const PackedB<float>& wih = *w.packed_ih;
  const PackedB<float>& whh = *w.packed_hh;
  const index_t gate_panels = H / amx::kBlock, row_panels = ceil_div(B, index_t(amx::kBlock));
  const index_t pe_x = amx::panel_elems(I), pe_h = amx::panel_elems(H);
  const CellOut<float> o = cell_out(s, gate_panels, s.input + s.hidden, c_n, reserve, b);
  float *const save = o.save, *const aux = o.aux, *const c = o.c, *const h = y[0];
  c_n = o.c_n;
  const int nt = o.nt;
  float *const xp = b.xp.data(), *const gh = b.gh.data();
  const float* const bias = b.bias.data();
  AlignedBuffer<amx::bf16> ap(static_cast<std::size_t>(row_panels * (pe_x + pe_h)));
  amx::bf16* const ax = ap.data();
  amx::bf16* const ah = ap.data() + row_panels * pe_x;
  std::optional<PanelShare> share;
  if (nt > 1) share.emplace(nt, gate_panels);
  const bool reverse = alternate_direction(&wih);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    for_each_xh_panel(B, [&](bool hx, index_t ip, index_t i, int rows) {  // x and h0 as A panels
      if (hx)
        amx::pack_a_panel(rows, H, h0 + i * H, H, 1, ah + ip * pe_h);
      else
        amx::pack_a_panel(rows, I, x + i * I, I, 1, ax + ip * pe_x);
    });
#pragma omp barrier
    const amx::TileScope tiles;
    for_each_unit(share ? &*share : nullptr, gate_panels, reverse, [&](index_t jp) {
      for (index_t ip = 0; ip < row_panels; ++ip) {
        const index_t i = ip * amx::kBlock;
        const int m_t = static_cast<int>(std::min<index_t>(amx::kBlock, B - i));
        for (int q = 0; q < G; ++q) {
          const index_t p = q * gate_panels + jp, j = q * H + jp * amx::kBlock;
          if (gru && q == 2) {  // gate n: W_hn h apart, into gh, which the reset gate scales
            amx::tile(amx::steps(I), ax + ip * pe_x, wih.amx_panel(p), xp + i * GH + j, GH, 1, m_t, amx::kBlock,
                      1.f, 0.f, bias + j, false);
            amx::tile(amx::steps(H), ah + ip * pe_h, whh.amx_panel(p), gh + i * GH + j, GH, 1, m_t, amx::kBlock,
                      1.f, 0.f, nullptr, false);
          } else {
            amx::tile(amx::steps(I), ax + ip * pe_x, wih.amx_panel(p), xp + i * GH + j, GH, 1, m_t, amx::kBlock,
                      1.f, 0.f, bias + j, false, amx::steps(H), ah + ip * pe_h, whh.amx_panel(p));
          }
        }
      }
      const index_t j0 = jp * amx::kBlock, j1 = j0 + amx::kBlock;
      const StepRows step{s.cell, B, H, j0, j1};
      forward_rows<float>(step, xp, gru ? gh : nullptr, true, bias + GH, h0, H, c0, c, h, H, save, aux, zeros);
      final_states<float>(step, h, H, c, h_n, c_n);
    });
  }
}

template <typename T>
void fused_packed_cell_step(const RnnShape& s, const RnnWeights<T>& w, const T* x, const T* h0, const T* c0,
                            T* const* y, T* h_n, T* c_n, T* reserve, DirBuffers<T>& b, const T* zeros) {
  if constexpr (std::is_same_v<T, float>) {
    if (packed_cell_on_tiles(s, w, x, h0))
      return fused_packed_cell_step_amx(s, w, x, h0, c0, y, h_n, c_n, reserve, b, zeros);
  }
  const index_t B = s.batch, H = s.hidden, I = s.input;
  const int G = rnn_gates(s.cell);
  const index_t GH = G * H;
  const bool gru = s.cell == RnnCell::gru;
  const PackedB<T>& wih = *w.packed_ih;
  const PackedB<T>& whh = *w.packed_hh;
  const UKernel<T>& uk = wih.ukernel();
  const index_t gate_panels = H / uk.nr;
  const CellOut<T> o = cell_out(s, gate_panels, s.input + s.hidden, c_n, reserve, b);
  T *const save = o.save, *const aux = o.aux, *const c = o.c, *const h = y[0];
  c_n = o.c_n;
  const int nt = o.nt;
  T *const xp = b.xp.data(), *const gh = b.gh.data();
  const T* const bias = b.bias.data();
  AlignedBuffer<T> ap(static_cast<std::size_t>(std::max<index_t>(B * (I + H), 1)));
  T* const ap1 = ap.data();
  T* const ap2 = ap.data() + B * I;
  std::optional<PanelShare> share;
  if (nt > 1) share.emplace(nt, gate_panels);
  const bool reverse = alternate_direction(&wih);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = thread_id(), nth = thread_count();
    pack_a_rows_part<T>(uk, B, I, x, I, 1, ap1, tid, nth);
    if (h0) pack_a_rows_part<T>(uk, B, H, h0, H, 1, ap2, tid, nth);
#pragma omp barrier
    for_each_unit(share ? &*share : nullptr, gate_panels, reverse, [&](index_t jp) {
      for (int q = 0; q < G; ++q) {
        const index_t p = q * gate_panels + jp;
        const bool apart = gru && q == 2;  // gate n: W_hn h into gh, which the reset gate scales
        gemm_packed_b<T>(B, ap1, wih, p, p + 1, T(0), xp, GH, false, h0 && !apart ? nullptr : bias);
        if (h0) gemm_packed_b<T>(B, ap2, whh, p, p + 1, apart ? T(0) : T(1), apart ? gh : xp, GH, false,
                                 apart ? nullptr : bias);
      }
      const index_t j0 = jp * uk.nr, j1 = j0 + uk.nr;
      const StepRows step{s.cell, B, H, j0, j1};
      forward_rows<T>(step, xp, gru && h0 ? gh : nullptr, true, bias + GH, h0, H, c0, c, h, H, save, aux, zeros);
      final_states<T>(step, h, H, c, h_n, c_n);
    });
  }
}

// Whether a float32 sequence's recurrent products run on AMX tiles (fused_step_amx): the tiles are
// enabled, every thread's share of the batch fills at least 3/4 of a 32-row tile (under the rule,
// RnnTiles::automatic; RnnTiles::on takes any batch), h_t is bounded (LSTM,
// GRU or tanh RNN without projection: |h| <= 1, so the only values the tiles would not split exactly
// are NaN, which propagates, and |h| < 2^-100, whose lost low parts are below float32's resolution of
// the pre-activation they join), and every W_hh and h0 split exactly (amx::splittable).
template <typename T>
bool rnn_amx_fits(const RnnShape& s, const RnnWeights<T>& w, const T* h0) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (!rnn_tiles_active(s) || s.proj > 0 || s.cell == RnnCell::rnn_relu) return false;
    // The batch rows a thread of a direction gets split by rows, whichever way the time loop splits:
    // both ways then take the same kernels, and give the same bits.
    const int threads = get_num_threads(), group = s.dirs == 2 && threads >= 2 ? threads / 2 : threads;
    if (s.tiles == RnnTiles::automatic && 4 * (s.batch / group) < 3 * amx::kBlock) return false;
    const index_t GH = rnn_gates(s.cell) * s.hidden, S = s.state();
    for (const float* whh : w.w_hh)
      if (!amx::splittable(GH, S, whh, S, 1)) return false;
    return !h0 || amx::splittable(index_t(s.layers) * s.dirs * s.batch, S, h0, S, 1);
  }
}

template <typename T>
RnnCellPath cell_path_of(const RnnShape& s, index_t input) {
  const index_t B = s.batch, depth = input + s.state(), GH = rnn_gates(s.cell) * s.hidden;
  switch (s.cell_path) {
    case RnnCellPath::direct:
      if (select_sa_kernel<T>(active_isa(), B).fn) return RnnCellPath::direct;
      break;
    case RnnCellPath::dots:
      if (B <= kSmallCellRows) return RnnCellPath::dots;
      break;
    case RnnCellPath::automatic:
      if (direct_wins<T>(B, depth)) return RnnCellPath::direct;
      if (B <= kSmallCellRows && small_m_wins(B, GH, depth, sizeof(T))) return RnnCellPath::dots;
      break;
    default: break;
  }
  return RnnCellPath::gemm;
}

template void fused_cell_step<float>(const RnnShape&, const RnnWeights<float>&, int, int, const float*, const float*,
                                     const float*, float* const*, float*, float*, float*, DirBuffers<float>&,
                                     const float*, bool);
template void fused_cell_step<double>(const RnnShape&, const RnnWeights<double>&, int, int, const double*,
                                      const double*, const double*, double* const*, double*, double*, double*,
                                      DirBuffers<double>&, const double*, bool);
template bool fused_packed_cell_fits<float>(const RnnShape&, const RnnWeights<float>&);
template bool fused_packed_cell_fits<double>(const RnnShape&, const RnnWeights<double>&);
template void fused_packed_cell_step<float>(const RnnShape&, const RnnWeights<float>&, const float*, const float*,
                                            const float*, float* const*, float*, float*, float*, DirBuffers<float>&,
                                            const float*);
template void fused_packed_cell_step<double>(const RnnShape&, const RnnWeights<double>&, const double*, const double*,
                                             const double*, double* const*, double*, double*, double*,
                                             DirBuffers<double>&, const double*);
template bool rnn_amx_fits<float>(const RnnShape&, const RnnWeights<float>&, const float*);
template bool rnn_amx_fits<double>(const RnnShape&, const RnnWeights<double>&, const double*);

}  // namespace rnn_detail

RnnCellPath rnn_cell_path(const RnnShape& s, index_t input, index_t elem_size) {
  return elem_size == 4 ? rnn_detail::cell_path_of<float>(s, input) : rnn_detail::cell_path_of<double>(s, input);
}
}  // namespace dnnkit
