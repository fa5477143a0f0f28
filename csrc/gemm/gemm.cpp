#include "gemm.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "blocking.h"
#include "pack.h"
#include "ukernel.h"

namespace dnnkit {
namespace {

// Loop structure (BLIS's, with the roles of A and B exchanged, as BLIS runs a row-major C):
//   ic: m in blocks of MC        -> pack the A block (MC x KC, in L3), shared by all threads
//   pc: k in blocks of KC
//   jc: n in blocks of NC        -> pack a B block (KC x NC, in L2)
//   ir: MR-tall micro-panels of A   (one A micro-panel in L1)
//   jr: NR-wide micro-panels of B   -> micro-kernel; epilogue after the last pc block
//
// Threads split n when it has enough panels: each thread packs its own B blocks into its own buffer,
// in its own L2, and runs the whole shared A block against them. Otherwise (few columns, many rows: the
// im2col GEMMs of early convolution layers) they share one B block and split the A micro-panels.
//
// B-outer (Plan::b_outer, where the blocking table's row enables it), BLIS's order for large products:
// each thread takes its share of the columns,
//   jc: its columns in blocks of NC  (a KC x NC block fills at most half of the thread's share of L3)
//   pc: k in blocks of KC         -> pack the thread's B block (KC x NC, in L3)
//   ic: m in blocks of MC         -> pack an A block (MC x KC, in L2), the thread's own
//   jr: NR-wide micro-panels of B    (one B micro-panel in L1)
//   ir: MR-tall micro-panels of A    -> micro-kernel
// A B micro-panel fills L1 and stays while the A micro-panels stream past it from L2: the micro-kernel's
// wide operand (NR values a step) then comes from L1 and only its broadcast one (MR values) from L2.

struct Plan {
  index_t mc, kc, nc;
  int mr, nr;
  int nthreads;
  bool split_n;  // true: each thread packs and runs its own B blocks; false: threads split the ir loop
  bool own_a;    // split_n on several threads, each packing the whole A block itself: no barriers
  bool a_in_place;  // A not packed: the micro-kernel reads its rows where they lie (UKernel::fn_a)
  bool b_outer;     // the B-outer order: mc, kc from b_outer_blocking, nc a B block's columns
  // split_n on several threads, each with one B block (its share of the columns within NC), A not own_a:
  // each thread packs A a micro-panel at a time into a slot of its own, MR x KC, just before that panel's
  // row of tiles (panels_then_tiles). Every thread then packs all of A, but into its own L1 and with no
  // barrier, where a shared A block is packed half by each thread, each reading the other's half from the
  // other core's cache (bench/log/2026-12-08-zen4.md).
  bool a_slots;
};

// MC and KC for m and k: equal-ish blocks rather than full blocks and a sliver. They depend on m and k
// only, so an A packed ahead of time (pack_a_blocks) has the layout every plan for it expects.
template <typename T>
void a_blocking(index_t m, index_t k, const UKernel<T>& uk, index_t* mc, index_t* kc) {
  const Blocking blk = blocking_for<T>(active_isa());
  *kc = k_block<T>(k, false);
  const index_t nmb = ceil_div(std::max<index_t>(m, 1), blk.mc);
  *mc = round_up(ceil_div(std::max<index_t>(m, 1), nmb), uk.mr);
}

// Offset of the packed A block (ic, pc) in pack_a_blocks' layout: blocks of round_up(mc, mr) x kc
// elements, k blocks inner.
inline index_t a_block_offset(index_t ic, index_t pc, index_t mc, index_t kc, index_t k, int mr) {
  const index_t per_block = round_up(mc, mr) * kc;
  return ((ic / mc) * ceil_div(k, kc) + pc / kc) * per_block;
}

// Columns a thread from which threads may split n rather than m (Plan::split_n).
constexpr index_t kSplitNCols = 256;
// Rows up to which threads also split n from half kSplitNCols columns a thread, where that shares the
// panels out more evenly than splitting m: A is then one small block that every thread reads.
constexpr index_t kSplitNRows = 256;
// Columns a thread from which threads that split n each pack their own copy of the A block (Plan::own_a).
constexpr index_t kOwnACols = 512;
// Columns up to which an A with contiguous rows is read where it lies rather than packed (Plan::a_in_place,
// where the micro-kernel has fn_a). Packing a value costs a fixed time, while the products that read it
// take time in proportion to n: below this many columns the packing is a share of the product worth
// saving.
constexpr index_t kAInPlaceCols = 512;
// A micro-panels (of MR rows) up to which a B with contiguous rows is read where it lies rather than packed
// (b_in_place), where threads split n: packing costs each value of B a read from memory and a write and a
// read in L2, which the few tiles that read it do not pay back; read in place, B streams from memory while
// the FMAs run. Not where B's rows lie a multiple of kAliasBytes apart: a panel's rows then fall in the same
// sets of L1 and L2 and evict each other (bench/log/2026-11-27-sapphire-rapids.md).
constexpr index_t kBInPlacePanels = 8;
constexpr index_t kAliasBytes = 4096;
// Rows, depth and columns from which a product runs B-outer (Plan::b_outer). On fewer rows of A, a B that
// streams from memory is better packed a block at a time into L2 and consumed there (the A-outer order);
// on a shallower depth, the micro-kernel's calls are too short to pay for B-outer's reads from L3 (each B
// micro-panel once per A block); on fewer columns, each thread's packing of the whole A weighs more than
// the order gains (A is then read in place where its rows are contiguous). A weight packed by pack_weight
// runs its own driver up to 252 rows (gemm_prepacked) and gemm() on more, in the same order as gemm() on
// the weight unpacked, so that both give the same bits.
constexpr index_t kBOuterRows = 512;
constexpr index_t kBOuterDepth = 128;
constexpr index_t kBOuterCols = 512;

// own_a: the plan packs A itself (no GemmArgs::a_packed), so its KC is free to follow the thread count.
template <typename T>
// a_rows: A's rows are contiguous (cs_a == 1), so that the micro-kernel may read them where they lie.
Plan make_plan(index_t m, index_t n, index_t k, int nthreads, const UKernel<T>& uk, bool own_a, bool a_rows = false) {
  const Blocking blk = blocking_for<T>(active_isa());
  Plan p;
  p.mr = uk.mr;
  p.nr = uk.nr;
  a_blocking<T>(m, k, uk, &p.mc, &p.kc);
  const index_t panels_m = ceil_div(m, uk.mr), panels_n = ceil_div(n, uk.nr);
  // Never more threads than there is work for: a thread needs at least one MR x NR tile.
  int nt = std::max(1, nthreads);
  nt = static_cast<int>(std::min<index_t>(nt, std::max<index_t>(panels_m * panels_n, 1)));
  if (double(m) * double(n) * double(k) < min_parallel_work()) nt = 1;
  p.nthreads = nt;
  if (own_a && deep_k_blocks(m, n, static_cast<index_t>(sizeof(T)), nt)) p.kc = k_block<T>(k, true);
  // Splitting n keeps each B block in one core's L2 and reuses each A micro-panel over all of it, but
  // every thread then reads the whole of A, each micro-panel of it for only its own columns: it needs
  // kSplitNCols or more columns per thread, and panels that share out about as evenly as A's, since
  // the thread with one panel more than another sets the time (bench/log/2026-11-25-zen2-avx2-path.md;
  // the columns, in bench/log/2026-11-26-zen1.md), or a small A (kSplitNRows) and half as many columns
  // where splitting m would leave one thread a panel more than another. Otherwise, splitting m reuses
  // each A micro-panel over all columns.
  auto uneven = [nt](index_t panels) { return double(ceil_div(panels, index_t(nt)) * nt) / double(panels); };
  p.split_n = nt == 1 || panels_n >= panels_m ||
              (n >= kSplitNCols * nt && uneven(panels_n) <= uneven(panels_m) + 0.02) ||
              (m <= kSplitNRows && n >= kSplitNCols / 2 * nt && uneven(panels_n) + 0.02 < uneven(panels_m));
  // Equal NC blocks, each a multiple of NR; when threads split n, a multiple of nt of them.
  index_t njb = ceil_div(std::max<index_t>(n, 1), nc_for_l2(blk, p.kc, static_cast<index_t>(sizeof(T))));
  if (p.split_n) njb = round_up(njb, nt);
  p.nc = round_up(ceil_div(std::max<index_t>(n, 1), njb), uk.nr);
  // Threads that split n all read the whole A block. Each packs its own copy where its share of the
  // columns makes that copy cheap against the products that read it (kOwnACols or more columns a thread:
  // packing a value costs under a cycle, the products read it 2n/nt/(FMAs a cycle) cycles): no thread
  // then waits for another, at the A block or at the end of each depth block.
  p.a_in_place = own_a && a_rows && uk.fn_a && n <= kAInPlaceCols;
  p.own_a = own_a && !p.a_in_place && p.split_n && nt > 1 && n >= kOwnACols * nt;
  // B-outer: each thread packs its own A blocks (no A read in place, no shared or copied A block).
  p.b_outer = blk.b_outer && own_a && p.split_n && m >= kBOuterRows && k >= kBOuterDepth && n >= kBOuterCols;
  p.a_slots = own_a && !p.a_in_place && !p.own_a && !p.b_outer && p.split_n && nt > 1 &&
              ceil_div(panels_n, index_t(nt)) <= p.nc / uk.nr;
  if (p.b_outer) {
    p.a_in_place = false;
    p.own_a = false;
    b_outer_blocking<T>(k, uk.mr, uk.nr, &p.mc, &p.kc);
    // A thread's share of the panels in equal blocks, each KC x NC within half its share of L3.
    const index_t share = ceil_div(panels_n, index_t(nt));
    const index_t fit = std::max<index_t>(1, static_cast<index_t>(l3_cache_bytes()) / (2 * nt) /
                                                 (p.kc * uk.nr * static_cast<index_t>(sizeof(T))));
    p.nc = ceil_div(share, ceil_div(share, fit)) * uk.nr;
  }
  return p;
}

// A tile of a last B panel of half the micro-kernel's width or less on the half-width kernel
// (UKernel::half; a_panel of stride m_t, b_panel packed NR wide); false, and nothing done, for a wider
// panel or an ISA without one.
template <typename T>
inline bool half_width_tile(const GemmArgs<T>& g, const UKernel<T>& uk, index_t kc, const T* a_panel,
                            const T* b_panel, T* c, T beta, int m_t, int n_t, const T* bias) {
  if (2 * n_t > uk.nr || !uk.half) return false;
  uk.half[m_t - 1](kc, a_panel, b_panel, uk.nr, nullptr, 1, c, g.rs_c, g.cs_c, g.alpha, beta, m_t, n_t, bias,
                   g.bias_per_row);
  return true;
}

// The micro-panels of one packed A block (mc rows: full MR-row panels, then a tail panel of exactly the
// remaining rows, stride m_t, run by the exact-height kernel) against the B block's panels, b_stride
// elements apart (NR*KC when packed here, NR*k when read in place from GemmArgs::b_panels).
// A micro-panel outermost: it stays in L1 while the B block streams from L2. ap null: A read where it
// lies (Plan::a_in_place), rows of depth [pc, pc + kc) of it, by UKernel::fn_a.
template <typename T>
void macro_kernel(const GemmArgs<T>& g, const UKernel<T>& uk, const T* ap, const T* bp, index_t b_stride, index_t ic,
                  index_t mc, index_t ir_begin, index_t ir_end, index_t jc, index_t nc, index_t pc, index_t kc,
                  T beta, bool last) {
  const int mr = uk.mr, nr = uk.nr;
  const index_t n_jr = ceil_div(nc, nr);
  // The bias (per column, or per row: a convolution's output channels, the transposed problem's) goes
  // into the micro-kernel's store on the last k block; the activation into a pass over the tile after.
  const T* const k_bias = last ? g.bias : nullptr;
  const bool epilogue = last && g.act != Activation::identity;
  for (index_t ir = ir_begin; ir < ir_end; ++ir) {
    const index_t i = ic + ir * mr;
    const int m_t = static_cast<int>(std::min<index_t>(mr, ic + mc - i));
    const ukernel_fn<T> fn = m_t == mr ? uk.fn : uk.rows[m_t - 1];
    const T* a_panel = ap ? ap + ir * mr * kc : nullptr;
    // The row's first tile reads its A micro-panel from L3 (the packed A block outgrows L2), the rest
    // from L1: that tile prefetches A ahead as well (UKernel::far_a).
    const ukernel_fn<T> first_a = m_t == mr ? uk.far_a : nullptr;
    for (index_t jr = 0; jr < n_jr; ++jr) {
      const index_t j = jc + jr * nr;
      const int n_t = static_cast<int>(std::min<index_t>(nr, jc + nc - j));
      T* c = g.c + i * g.rs_c + j * g.cs_c;
      const T* bias = k_bias ? k_bias + (g.bias_per_row ? i : j) : nullptr;
      if (!ap) {
        uk.fn_a(kc, g.a + i * g.rs_a + pc, g.rs_a, bp + jr * b_stride, c, g.rs_c, g.cs_c, g.alpha, beta, m_t, n_t, bias,
                g.bias_per_row);
      } else if (!half_width_tile(g, uk, kc, a_panel, bp + jr * b_stride, c, beta, m_t, n_t, bias)) {
        const ukernel_fn<T> tile = jr == 0 && first_a ? first_a : fn;
        tile(kc, a_panel, bp + jr * b_stride, c, g.rs_c, g.cs_c, g.alpha, beta, m_t, n_t, bias, g.bias_per_row);
      }
      if (epilogue) apply_epilogue<T>(c, g.rs_c, g.cs_c, m_t, n_t, nullptr, g.act);
    }
  }
}

// The B-outer order's macro-kernel: the packed A block (mc rows, a tail panel of the exact height) against
// the B block's panels, b_stride elements apart (NR*KC when packed here, NR*k when read in place from
// GemmArgs::b_panels), B micro-panel outermost (in L1), the A micro-panels (from L2) inner.
template <typename T>
void macro_kernel_b_outer(const GemmArgs<T>& g, const UKernel<T>& uk, const T* ap, const T* bp, index_t b_stride,
                          index_t ic, index_t mc, index_t jc, index_t nc, index_t kc, T beta, bool last) {
  const int mr = uk.mr, nr = uk.nr;
  const index_t n_jr = ceil_div(nc, nr), n_ir = ceil_div(mc, mr);
  const T* const k_bias = last ? g.bias : nullptr;
  const bool epilogue = last && g.act != Activation::identity;
  for (index_t jr = 0; jr < n_jr; ++jr) {
    const index_t j = jc + jr * nr;
    const int n_t = static_cast<int>(std::min<index_t>(nr, jc + nc - j));
    for (index_t ir = 0; ir < n_ir; ++ir) {
      const index_t i = ic + ir * mr;
      const int m_t = static_cast<int>(std::min<index_t>(mr, ic + mc - i));
      T* c = g.c + i * g.rs_c + j * g.cs_c;
      const T* bias = k_bias ? k_bias + (g.bias_per_row ? i : j) : nullptr;
      if (!half_width_tile(g, uk, kc, ap + ir * mr * kc, bp + jr * b_stride, c, beta, m_t, n_t, bias)) {
        const ukernel_fn<T> fn = m_t == mr ? uk.fn : uk.rows[m_t - 1];
        fn(kc, ap + ir * mr * kc, bp + jr * b_stride, c, g.rs_c, g.cs_c, g.alpha, beta, m_t, n_t, bias,
           g.bias_per_row);
      }
      if (epilogue) apply_epilogue<T>(c, g.rs_c, g.cs_c, m_t, n_t, nullptr, g.act);
    }
  }
}

// Packs the B block of columns [jc, jc + nc), rows [pc, pc + kc), panels [jr0, jr1) of it.
template <typename T>
void pack_b_block(const GemmArgs<T>& g, int nr, index_t pc, index_t kc, index_t jc, index_t nc, index_t jr0,
                  index_t jr1, T* bp) {
  // A row-major B, several panels: rows outermost (pack_b_rows).
  if (!g.pack_b && g.b_group_cols == 0 && g.cs_b == 1 && jr1 - jr0 > 1) {
    const index_t j0 = jr0 * nr, cols = std::min(nc, jr1 * nr) - j0;
    if (pack_b_rows_fixed<T>(kc, cols, nr, g.b + pc * g.rs_b + jc + j0, g.rs_b, bp + jr0 * nr * kc)) return;
  }
  for (index_t jr = jr0; jr < jr1; ++jr) {
    const index_t j = jc + jr * nr;
    const index_t n_t = std::min<index_t>(nr, jc + nc - j);
    T* dst = bp + jr * nr * kc;
    if (g.pack_b) {
      g.pack_b(g.pack_b_ctx, pc, kc, j, n_t, nr, dst);
      continue;
    }
    if (g.b_group_cols == 0) {
      pack_b_panel<T>(kc, n_t, g.b + pc * g.rs_b + j * g.cs_b, g.rs_b, g.cs_b, nr, dst);
      continue;
    }
    const index_t gc = g.b_group_cols, grp = j / gc, jj = j % gc;
    const T* b0 = g.b + grp * g.b_group_stride + pc * g.rs_b;
    if (jj + n_t <= gc) {  // the panel lies in one group
      pack_b_panel<T>(kc, n_t, b0 + jj * g.cs_b, g.rs_b, g.cs_b, nr, dst);
      continue;
    }
    // A panel across groups (images side by side, a plane narrower than NR or straddling a panel): its
    // columns cut into runs, each within one group, copied run by run along every row.
    const T* src[64];  // NR <= 64
    int start[65];
    int runs = 0;
    for (int l = 0; l < n_t;) {
      const index_t col = j + l, cg = col / gc, cj = col % gc;
      const int len = static_cast<int>(std::min<index_t>(n_t - l, gc - cj));
      src[runs] = g.b + cg * g.b_group_stride + pc * g.rs_b + cj * g.cs_b;
      start[runs++] = l;
      l += len;
    }
    start[runs] = static_cast<int>(n_t);
    for (index_t p = 0; p < kc; ++p) {
      T* d = dst + p * nr;
      for (int r = 0; r < runs; ++r) {
        const T* s = src[r] + p * g.rs_b;
        for (int l = start[r]; l < start[r + 1]; ++l) d[l] = s[(l - start[r]) * g.cs_b];
      }
      for (int l = static_cast<int>(n_t); l < nr; ++l) d[l] = T(0);
    }
  }
}

// C^T = B^T A^T: the same product with the operands' roles exchanged (no data moves, only strides).
template <typename T>
GemmArgs<T> transposed(const GemmArgs<T>& g) {
  GemmArgs<T> t = g;
  t.m = g.n;
  t.n = g.m;
  t.a = g.b;
  t.rs_a = g.cs_b;
  t.cs_a = g.rs_b;
  t.b = g.a;
  t.rs_b = g.cs_a;
  t.cs_b = g.rs_a;
  t.rs_c = g.cs_c;
  t.cs_c = g.rs_c;
  t.bias_per_row = !g.bias_per_row;
  return t;
}

// Few columns that fill the last NR-wide panel badly (49 output pixels of a 7x7 convolution at batch 1
// compute 64 columns) and many more rows: solve C^T = B^T A^T instead, where those columns become rows,
// which the exact-height kernels compute without padding. C is then written through its strides.
template <typename T>
bool transposing_helps(index_t m, index_t n, const UKernel<T>& uk) {
  if (n >= 4 * uk.nr || m <= 2 * n) return false;
  const double fill_n = double(n) / double(round_up(n, uk.nr));
  const double fill_m = double(m) / double(round_up(m, uk.nr));
  return fill_m > fill_n + 0.1;
}

// k == 0: the product is empty, C := beta*C (C unread when beta == 0), then the epilogue.
template <typename T>
void scale_c(const GemmArgs<T>& g) {
  // beta 1 and no epilogue: C as it is (an accumulating product over an empty range, such as a one-step
  // RNN's dW_hh over the steps after the first, would otherwise rewrite a whole weight gradient).
  if (g.beta == T(1) && !g.bias && g.act == Activation::identity) return;
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = 0; j < g.n; ++j) {
      T* c = g.c + i * g.rs_c + j * g.cs_c;
      *c = g.beta == T(0) ? T(0) : g.beta * *c;
    }
  apply_epilogue<T>(g.c, g.rs_c, g.cs_c, g.m, g.n, g.bias, g.act, g.bias_per_row);
}

// B read where it lies (b_in_place): the packed A block (mc rows, a tail panel of the exact height)
// against B's NR-wide panels [jr0, jr1) at depth [pc, pc + kc), B micro-panel outermost, the A micro-panels
// (in L2) inner. Each tile fetches into L2 its share of the next panel's rows (ukernel_b_fn's pf), so
// that B streams from memory while the FMAs run rather than in a packing pass before them. A panel past
// the last full one (n not a multiple of NR) is packed into `edge` (KC x NR elements).
template <typename T>
void macro_kernel_b_rows(const GemmArgs<T>& g, const UKernel<T>& uk, const T* ap, index_t ic, index_t mc,
                         index_t jr0, index_t jr1, index_t pc, index_t kc, T beta, bool last, T* edge) {
  const int mr = uk.mr, nr = uk.nr;
  const index_t n_ir = ceil_div(mc, mr), full = g.n / nr;
  const T* const k_bias = last ? g.bias : nullptr;
  const bool epilogue = last && g.act != Activation::identity;
  // Tile ir fetches rows [ir * share, ir * share + share) of the next panel, one every n_ir steps.
  const index_t share = ceil_div(kc, n_ir);
  for (index_t jr = jr0; jr < jr1; ++jr) {
    const index_t j = jr * nr;
    const int n_t = static_cast<int>(std::min<index_t>(nr, g.n - j));
    const T* const b = g.b + pc * g.rs_b + j;
    if (jr >= full) pack_b_block<T>(g, nr, pc, kc, j, n_t, 0, 1, edge);
    const bool next = jr + 1 < jr1 && jr + 1 < full;
    for (index_t ir = 0; ir < n_ir; ++ir) {
      const index_t i = ic + ir * mr;
      const int m_t = static_cast<int>(std::min<index_t>(mr, ic + mc - i));
      T* c = g.c + i * g.rs_c + j * g.cs_c;
      const T* bias = k_bias ? k_bias + (g.bias_per_row ? i : j) : nullptr;
      if (jr >= full) {
        const ukernel_fn<T> fn = m_t == mr ? uk.fn : uk.rows[m_t - 1];
        fn(kc, ap + ir * mr * kc, edge, c, g.rs_c, g.cs_c, g.alpha, beta, m_t, n_t, bias, g.bias_per_row);
      } else {
        const T* pf = next && ir * share < kc ? b + nr + ir * share * g.rs_b : nullptr;
        uk.fn_b[m_t - 1](kc, ap + ir * mr * kc, b, g.rs_b, pf, static_cast<int>(n_ir), c, g.rs_c, g.cs_c, g.alpha,
                         beta, m_t, n_t, bias, g.bias_per_row);
      }
      if (epilogue) apply_epilogue<T>(c, g.rs_c, g.cs_c, m_t, n_t, nullptr, g.act);
    }
  }
}

// Packs micro-panels [ir0, ir1) of the A block at (ic, pc) into ap; a tail panel has its exact height.
template <typename T>
void pack_a_block(const T* a, index_t rs_a, index_t cs_a, int mr, index_t ic, index_t mc, index_t pc, index_t kc,
                  index_t ir0, index_t ir1, T* ap) {
  // Contiguous columns, several panels: columns outermost (pack_a_cols).
  if (rs_a == 1 && cs_a != 1 && ir1 - ir0 > 1) {
    const index_t i0 = ic + ir0 * mr, rows = std::min(ic + mc, ic + ir1 * mr) - i0;
    if (pack_a_cols_fixed<T>(rows, kc, mr, a + i0 + pc * cs_a, cs_a, ap + ir0 * mr * kc)) return;
  }
  for (index_t ir = ir0; ir < ir1; ++ir) {
    const index_t i = ic + ir * mr;
    const int m_t = static_cast<int>(std::min<index_t>(mr, ic + mc - i));
    pack_a_panel<T>(m_t, kc, a + i * rs_a + pc * cs_a, rs_a, cs_a, m_t, ap + ir * mr * kc);
  }
}

// The B-outer order (Plan::b_outer): each thread its share of the columns, its own A and B buffers (ea,
// eb: p.nthreads of a_block and b_block elements each; eb unused where B is read in place); no barriers.
template <typename T>
void gemm_b_outer(const GemmArgs<T>& g, const UKernel<T>& uk, const Plan& p, T* ea, index_t a_block, T* eb,
                  index_t b_block) {
  const index_t panels = ceil_div(g.n, index_t(p.nr));
#pragma omp parallel num_threads(p.nthreads) if (p.nthreads > 1)
  {
    const int tid = thread_id(), nt = thread_count();
    // This thread's columns: an equal share of the NR-wide panels (shares differ by at most one panel), in
    // blocks of at most p.nc columns.
    const auto [q0, q1] = even_share(panels, tid, nt);
    T* const ap = ea + tid * a_block;
    T* const bp = eb + tid * b_block;
    const index_t j_end = std::min(q1 * p.nr, g.n);
    for (index_t jc = q0 * p.nr; jc < j_end; jc += p.nc) {
      const index_t nc = std::min(p.nc, j_end - jc);
      for (index_t pc = 0; pc < g.k; pc += p.kc) {
        const index_t kc = std::min(p.kc, g.k - pc);
        const T beta = pc == 0 ? g.beta : T(1);
        const bool last = pc + kc >= g.k;
        // The B block: packed here, or read in place from GemmArgs::b_panels (panels NR*k apart).
        const T* const bb = g.b_panels ? g.b_panels + jc * g.k + pc * p.nr : bp;
        const index_t b_stride = g.b_panels ? p.nr * g.k : p.nr * kc;
        if (!g.b_panels) pack_b_block<T>(g, p.nr, pc, kc, jc, nc, 0, ceil_div(nc, p.nr), bp);
        for (index_t ic = 0; ic < g.m; ic += p.mc) {
          const index_t mc = std::min(p.mc, g.m - ic);
          pack_a_block<T>(g.a, g.rs_a, g.cs_a, p.mr, ic, mc, pc, kc, 0, ceil_div(mc, p.mr), ap);
          macro_kernel_b_outer<T>(g, uk, ap, bb, b_stride, ic, mc, jc, nc, kc, beta, last);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
index_t packed_a_blocks_elems(index_t m, index_t k) {
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  index_t mc, kc;
  a_blocking<T>(m, k, uk, &mc, &kc);
  return ceil_div(std::max<index_t>(m, 1), mc) * ceil_div(std::max<index_t>(k, 1), kc) * round_up(mc, uk.mr) * kc;
}

template <typename T>
void pack_a_blocks(index_t m, index_t k, const T* a, index_t rs, index_t cs, T* ap, int nthreads) {
  if (m <= 0 || k <= 0) return;
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  index_t mc, kc;
  a_blocking<T>(m, k, uk, &mc, &kc);
  const index_t nkb = ceil_div(k, kc), blocks = ceil_div(m, mc) * nkb;
  int nt = static_cast<int>(std::max<index_t>(1, std::min<index_t>(nthreads, blocks)));
  if (double(m) * double(k) < min_parallel_work()) nt = 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (index_t blk = 0; blk < blocks; ++blk) {
    const index_t ic = blk / nkb * mc, pc = blk % nkb * kc;
    const index_t mcb = std::min(mc, m - ic), kcb = std::min(kc, k - pc);
    pack_a_block<T>(a, rs, cs, uk.mr, ic, mcb, pc, kcb, 0, ceil_div(mcb, uk.mr),
                    ap + a_block_offset(ic, pc, mc, kc, k, uk.mr));
  }
}

template <typename T>
index_t gemm_workspace_bytes(index_t m, index_t n, index_t k, int nthreads) {
  if (m == 0 || n == 0 || k == 0) return 0;
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  // The streamed products' partials where the operands' strides let them run (gemm_stream).
  const index_t stream = gemm_stream_workspace_bytes<T>(m, n, k);
  if (transposing_helps<T>(m, n, uk)) return std::max(stream, gemm_workspace_bytes<T>(n, m, k, nthreads));
  const Plan p = make_plan<T>(m, n, k, nthreads > 0 ? nthreads : get_num_threads(), uk, true);
  const index_t a_elems = std::max(round_up(p.mc, p.mr) * p.kc * (p.own_a || p.b_outer ? p.nthreads : 1),
                                   p.a_slots ? index_t(p.mr) * p.kc * p.nthreads : 0);
  const index_t b_elems = p.nc * p.kc * (p.split_n ? p.nthreads : 1);
  const index_t bytes = std::max(stream, (a_elems + b_elems) * static_cast<index_t>(sizeof(T)));
  // The tiles' plan where they may take the product (the FMA kernels' where an operand turns out not to
  // split): the larger of the two.
  if (std::is_same_v<T, float>) return std::max(bytes, amx::workspace_bytes(m, n, k, nthreads));
  return bytes;
}

// Whether the product's B is read where it lies (macro_kernel_b_rows): a row-major B, each thread its
// own columns, A a few micro-panels packed here.
template <typename T>
bool b_in_place(const GemmArgs<T>& g, const Plan& p, const UKernel<T>& uk) {
  return uk.fn_b && p.split_n && !p.b_outer && !p.a_in_place && !g.a_packed && !g.b_panels && !g.pack_b &&
         g.b_group_cols == 0 && g.cs_b == 1 &&
         (g.rs_b * index_t(sizeof(T))) % kAliasBytes != 0 && ceil_div(g.m, index_t(p.mr)) <= kBInPlacePanels;
}

template <typename T>
void gemm(const GemmArgs<T>& g, int nthreads) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    scale_c(g);
    return;
  }
  const bool any_path = g.path == GemmPath::automatic;
  if (any_path && gemm_stream<T>(g, nthreads)) return;
  if constexpr (std::is_same_v<T, float>) {
    // float32 on AMX tiles where the CPU has them and the operands split exactly (amx.h).
    if (any_path && amx::gemm(g, nthreads)) return;
  }
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  if (any_path && g.b_group_cols == 0 && !g.pack_b && !g.a_packed && !g.b_panels &&
      transposing_helps<T>(g.m, g.n, uk))
    return gemm<T>(transposed(g), nthreads);
  const Plan p = make_plan<T>(g.m, g.n, g.k, nthreads > 0 ? nthreads : get_num_threads(), uk, !g.a_packed,
                              g.cs_a == 1);
  const index_t b_block = p.nc * p.kc;
  // Allocated before the parallel region: an exception must not cross it.
  const index_t a_block = round_up(p.mc, p.mr) * p.kc;
  if (p.b_outer) {
    AlignedBuffer<T> ea(static_cast<std::size_t>(a_block * p.nthreads));
    AlignedBuffer<T> eb(g.b_panels ? 0 : static_cast<std::size_t>(b_block * p.nthreads));
    gemm_b_outer<T>(g, uk, p, ea.data(), a_block, eb.data(), b_block);
    return;
  }
  const bool a_buffer = !g.a_packed && !p.a_in_place;
  const bool b_rows = b_in_place(g, p, uk);
  // Plan::a_slots where B is packed here (with B in place or pre-packed, the shared A block).
  const bool a_slots = p.a_slots && a_buffer && !b_rows && !g.b_panels;
  const index_t a_slot = index_t(p.mr) * p.kc;
  AlignedBuffer<T> abuf(a_buffer ? static_cast<std::size_t>(std::max(a_block * (p.own_a ? p.nthreads : 1),
                                                                     a_slots ? a_slot * p.nthreads : 0))
                                 : 0);
  AlignedBuffer<T> bbuf(g.b_panels ? 0 : static_cast<std::size_t>(b_block * (p.split_n ? p.nthreads : 1)));

#pragma omp parallel num_threads(p.nthreads) if (p.nthreads > 1)
  {
#ifdef _OPENMP
    const int tid = omp_get_thread_num();
    const int nt = omp_get_num_threads();
#else
    const int tid = 0;
    const int nt = 1;
#endif
    // A slot each where the team is the planned one (its shares then within one B block each).
    const bool slots = a_slots && nt == p.nthreads;
    for (index_t ic = 0; ic < g.m; ic += p.mc) {
      const index_t mc = std::min(p.mc, g.m - ic);
      const index_t n_ir = ceil_div(mc, p.mr);
      for (index_t pc = 0; pc < g.k; pc += p.kc) {
        const index_t kc = std::min(p.kc, g.k - pc);
        const T beta = pc == 0 ? g.beta : T(1);
        const bool last = pc + kc >= g.k;
        // The A block: packed here, micro-panels [ir0, ir1) at a time, or already packed by the caller.
        T* const own_a =
            p.a_in_place ? nullptr : abuf.data() + (p.own_a ? tid * a_block : slots ? tid * a_slot : 0);
        const T* const ap = g.a_packed ? g.a_packed + a_block_offset(ic, pc, p.mc, p.kc, g.k, p.mr) : own_a;
        auto pack_a = [&](index_t ir0, index_t ir1) {
          if (a_buffer) pack_a_block<T>(g.a, g.rs_a, g.cs_a, p.mr, ic, mc, pc, kc, ir0, ir1, own_a);
        };
        // This thread's A micro-panels [ir0, ir1) against one B block (bp, columns [jc, jc + nc)), each
        // panel packed into `slot` just before its row of tiles: where the panels meet no other B block,
        // a panel is packed into L1 and read from there, rather than the whole A block packed out to L3
        // and read back.
        auto panels_then_tiles = [&](T* slot, index_t ir0, index_t ir1, const T* bp, index_t jc, index_t nc) {
          for (index_t ir = ir0; ir < ir1; ++ir) {
            const index_t i = ic + ir * p.mr, rows = ic + mc - i;
            pack_a_block<T>(g.a, g.rs_a, g.cs_a, p.mr, i, rows, pc, kc, 0, 1, slot);
            macro_kernel<T>(g, uk, slot, bp, p.nr * kc, i, rows, 0, 1, jc, nc, pc, kc, beta, last);
          }
        };
        // The B block at column jc read in place from GemmArgs::b_panels: its panels NR*k apart.
        auto in_place = [&](index_t jc, index_t nc, index_t ir0, index_t ir1) {
          macro_kernel<T>(g, uk, ap, g.b_panels + jc * g.k + pc * p.nr, p.nr * g.k, ic, mc, ir0, ir1, jc, nc, pc, kc,
                          beta, last);
        };
        if (p.split_n) {
          // This thread's columns: an equal share of the NR-wide panels (a share differs from another by
          // at most one panel), in equal blocks of at most NC columns.
          const Share cols = even_share(ceil_div(g.n, index_t(p.nr)), tid, nt);
          const index_t q0 = cols.lo, share = cols.hi - cols.lo;
          const index_t blocks = ceil_div(share, p.nc / p.nr);
          // Every thread reads the whole A block: its own copy (own_a), or one packed together, a run of
          // panels each; an A block of its own against one B block, a panel at a time.
          const bool panel_at_a_time =
              a_buffer && !g.b_panels && !b_rows && (p.own_a || slots || nt == 1) && blocks == 1;
          if (slots) {
            // panel_at_a_time, or no columns for this thread (blocks == 0): no A block to pack
          } else if (!panel_at_a_time && (p.own_a || g.a_packed || p.a_in_place)) {
            pack_a(0, n_ir);
          } else if (!panel_at_a_time) {
            const Share rows = even_share(n_ir, tid, nt);
            pack_a(rows.lo, rows.hi);
#pragma omp barrier  // A block complete
          }
          T* const own = bbuf.data() + tid * b_block;
          // B read where it lies: all of this thread's panels at once, no B block packed.
          if (b_rows) macro_kernel_b_rows<T>(g, uk, ap, ic, mc, q0, q0 + share, pc, kc, beta, last, own);
          for (index_t jb = 0; jb < (b_rows ? 0 : blocks); ++jb) {
            const index_t jc = (q0 + share * jb / blocks) * p.nr;
            const index_t nc = std::min((q0 + share * (jb + 1) / blocks) * p.nr, g.n) - jc;
            if (g.b_panels) {
              in_place(jc, nc, 0, n_ir);
              continue;
            }
            pack_b_block<T>(g, p.nr, pc, kc, jc, nc, 0, ceil_div(nc, p.nr), own);
            if (panel_at_a_time)
              panels_then_tiles(own_a, 0, n_ir, own, jc, nc);
            else
              macro_kernel<T>(g, uk, ap, own, p.nr * kc, ic, mc, 0, n_ir, jc, nc, pc, kc, beta, last);
          }
        } else {
          // Each thread packs and runs only its own A micro-panels (even_share): no barrier for A.
          T* bp = bbuf.data();
          const auto [ir0, ir1] = even_share(n_ir, tid, nt);
          const bool panel_at_a_time = a_buffer && !g.b_panels && g.n <= p.nc;
          if (!panel_at_a_time) pack_a(ir0, ir1);
          for (index_t jc = 0; jc < g.n; jc += p.nc) {
            const index_t nc = std::min(p.nc, g.n - jc);
            if (g.b_panels) {
              in_place(jc, nc, ir0, ir1);
            } else {
              const index_t n_jr = ceil_div(nc, p.nr);
#pragma omp for schedule(static)
              for (index_t jr = 0; jr < n_jr; ++jr) pack_b_block<T>(g, p.nr, pc, kc, jc, nc, jr, jr + 1, bp);
              // implicit barrier: B block complete
              if (panel_at_a_time) {
                panels_then_tiles(own_a + ir0 * p.mr * kc, ir0, ir1, bp, jc, nc);
              } else {
                macro_kernel<T>(g, uk, ap, bp, p.nr * kc, ic, mc, ir0, ir1, jc, nc, pc, kc, beta, last);
              }
            }
            // The shared B block, and the A buffer: a thread's micro-panels of the next (ic, pc) block
            // (another kc, another block height) may lie where another thread's of this block still are.
#pragma omp barrier
          }
        }
        if (p.split_n && !p.own_a && !slots && !g.a_packed && !p.a_in_place) {
#pragma omp barrier
        }  // the shared A block is free for the next pc
      }
    }
  }
}

template void gemm<float>(const GemmArgs<float>&, int);
template void gemm<double>(const GemmArgs<double>&, int);
template index_t packed_a_blocks_elems<float>(index_t, index_t);
template index_t packed_a_blocks_elems<double>(index_t, index_t);
template void pack_a_blocks<float>(index_t, index_t, const float*, index_t, index_t, float*, int);
template void pack_a_blocks<double>(index_t, index_t, const double*, index_t, index_t, double*, int);
template index_t gemm_workspace_bytes<float>(index_t, index_t, index_t, int);
template index_t gemm_workspace_bytes<double>(index_t, index_t, index_t, int);

}  // namespace dnnkit
