// Cache blocking for the GEMM driver: one table, one row per (ISA, dtype), scaled to this CPU's caches as
// it reports them (cpu_info.h). MR and NR come from the micro-kernel (ukernel_<isa>.cpp); MC, KC, NC are
// chosen so that
//   - a packed A micro-panel (MR x KC) stays in L1 while the B micro-panels stream past it: the table's
//     KC is for the L1 data cache it was measured with (AVX-512: 48 KiB, a 14-row float32 micro-panel of
//     35 KB at KC 640; AVX2: 32 KiB), and scales with this core's L1 (blocking_for);
//   - the packed B block (KC x NC) stays in L2: NC is the table's cap, lowered (nc_for_l2, for the KC of
//     the problem at hand) until the block fills at most two thirds of this core's L2 (the rest holds C's
//     lines and the A micro-panels passing through);
//   - the packed A block (MC x KC) stays in L3, shared by the threads: at most a quarter of it
//     (blocking_for). A float32 MC of 4116 (294 panels of 14, 686 of 6) packs B once for any m up to
//     4116 where L3 holds it (bench/log/2026-11-25-zen2-avx2-path.md).
// Where the row says so (b_outer), large products take the other order (gemm.cpp, Plan::b_outer), whose
// blocks b_outer_blocking sizes: a B micro-panel (KC x NR) fills L1 and stays there while the A
// micro-panels of an A block in L2 stream past it (bench/log/2026-11-25-zen2-avx2-path.md).
// Each k block is a pass over C (a load and a store of every tile), so deeper blocks pay as long as the
// A micro-panel fits L1. Where a product runs alone (one thread, dnnkit set to one thread) and C outgrows
// L2, a deeper KC (kc_alone, deep_k_blocks): on two threads, a deeper block means a narrower B block and
// more passes over the shared A block, which both threads stream from L3 at once. A product on A blocks
// packed ahead of time (pack_a_blocks) keeps the table's KC: its layout cannot depend on the thread count.
// The measurements behind the AVX-512 rows are the GEMM sittings of bench/log/2026-11-22-to-24.md (a
// 48 KiB L1 and a 2 MiB L2); the AVX2 rows run a Zen 2 core (32 KiB, 512 KiB) in bench/RESULTS.md.
#pragma once
#include <algorithm>

#include "../common.h"
#include "../cpu_info.h"

namespace dnnkit {

struct Blocking {
  index_t mc;
  index_t kc;
  index_t nc;
  index_t kc_alone;  // KC for a product that runs alone on a large C (deep_k_blocks)
  bool b_outer;      // large products run B-outer (Plan::b_outer), blocked by b_outer_blocking
};

// The largest NC up to the table's, a multiple of 32 columns (of every micro-kernel's NR), whose kc x NC
// block of `elem` bytes fills at most two thirds of L2; never under 128 columns.
inline index_t nc_for_l2(const Blocking& b, index_t kc, index_t elem) {
  const index_t fit = static_cast<index_t>(l2_cache_bytes()) * 2 / 3 / (std::max<index_t>(kc, 1) * elem) / 32 * 32;
  return std::max<index_t>(128, std::min(b.nc, fit));
}

// The table: per ISA and dtype, MC, KC, the cap on NC, KC alone and whether large products run B-outer
// (the AVX2 rows: bench/log/2026-11-25-zen2-avx2-path.md; the AVX-512 rows keep the A-outer order
// they were tuned for), for an L1 data cache of l1d_kib.
struct BlockingRow {
  Blocking b;
  index_t l1d_kib;
};

template <typename T>
inline BlockingRow blocking_table(Isa isa) {
  constexpr bool f32 = sizeof(T) == 4;
  switch (isa) {
    //                               MC    KC    NC (the cap), KC alone, B-outer; L1d
    case Isa::avx512: return f32 ? BlockingRow{{4116, 640, 1024, 1024, false}, 48}
                                 : BlockingRow{{2016, 320, 768, 512, false}, 48};
    case Isa::avx2:   return f32 ? BlockingRow{{4116, 256, 1024, 256, true}, 32}
                                 : BlockingRow{{2016, 256, 512, 256, true}, 32};
    default:          return f32 ? BlockingRow{{1024, 256, 512, 256, false}, 32}
                                 : BlockingRow{{1024, 256, 256, 256, false}, 32};
  }
}

// The table's row for this CPU: KC (and KC alone) scaled by this core's L1 data cache against the one
// the row was measured with, a multiple of 16 and at least 128; MC lowered, where the L3 is small, until
// the A block fills at most a quarter of it (never under 256 rows).
template <typename T>
inline Blocking blocking_for(Isa isa) {
  const BlockingRow row = blocking_table<T>(isa);
  Blocking b = row.b;
  const index_t l1d = static_cast<index_t>(l1d_cache_bytes()), tuned = row.l1d_kib << 10;
  auto scale_kc = [&](index_t kc) { return std::max<index_t>(128, kc * l1d / tuned / 16 * 16); };
  b.kc = scale_kc(b.kc);
  b.kc_alone = std::max(b.kc, scale_kc(b.kc_alone));
  const index_t l3 = static_cast<index_t>(l3_cache_bytes());
  if (l3 > 0) b.mc = std::min(b.mc, std::max<index_t>(256, l3 / 4 / (b.kc * index_t(sizeof(T)))));
  return b;
}

// Whether an m x n product of `elem`-byte values on `nthreads` threads takes kc_alone: it runs alone (on
// one thread, with dnnkit set to one thread, so no other dnnkit thread shares L3 with it) and its C
// outgrows L2, so that every k block is a pass over C in memory. (A C that stays in L2 gains nothing from
// fewer passes and loses the A micro-panel from L1.)
inline bool deep_k_blocks(index_t m, index_t n, index_t elem, int nthreads) {
  return nthreads == 1 && get_num_threads() == 1 &&
         double(m) * double(n) * double(elem) > double(l2_cache_bytes());
}

// The B-outer order's blocks for depth k: KC such that a B micro-panel (KC x NR) fills this core's L1
// data cache, in equal blocks of at most that (each a multiple of 8); MC, a multiple of MR, such that the
// A block (MC x KC) fills a fifth of L2.
template <typename T>
void b_outer_blocking(index_t k, int mr, int nr, index_t* mc, index_t* kc) {
  const index_t elem = static_cast<index_t>(sizeof(T));
  const index_t kmax = std::max<index_t>(128, static_cast<index_t>(l1d_cache_bytes()) / (nr * elem) / 16 * 16);
  const index_t nkb = ceil_div(std::max<index_t>(k, 1), kmax);
  *kc = round_up(ceil_div(std::max<index_t>(k, 1), nkb), 8);
  *mc = std::max<index_t>(mr, static_cast<index_t>(l2_cache_bytes()) / 5 / (kmax * elem) / mr * mr);
}

// KC for depth k: equal blocks of at most the table's KC (kc_alone where deep_k_blocks), each
// a multiple of 8, rather than full blocks and a sliver.
template <typename T>
index_t k_block(index_t k, bool alone) {
  const Blocking b = blocking_for<T>(active_isa());
  const index_t nkb = ceil_div(std::max<index_t>(k, 1), alone ? b.kc_alone : b.kc);
  return round_up(ceil_div(std::max<index_t>(k, 1), nkb), 8);
}

}  // namespace dnnkit
