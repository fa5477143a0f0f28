// Cache blocking for the GEMM driver: one table, one row per (ISA, dtype). MR and NR come from the
// micro-kernel (ukernel_<isa>.cpp); MC, KC, NC are chosen so that
//   - a packed A micro-panel (MR x KC) stays in L1 while the B micro-panels stream past it,
//   - the packed B block (KC x NC) stays in L2: NC is the table's cap, lowered (nc_for_l2, for the KC of
//     the problem at hand) until the block fills at most two thirds of this core's L2 (the rest holds C's
//     lines and the A micro-panels passing through),
//   - the packed A block (MC x KC) stays in L3, shared by the threads. AVX-512's MC of 4116 (294 panels
//     of 14) packs B once for any m up to 4116: 2016 packed B twice at m = 2048 (blocks of 1036 rows),
//     and one block took 0.99 of the time at 2048^3 on one thread, 1.00 on two and at 1024-4096.
// A B block larger than L2 streams from L3 instead; on a 1 MiB L2 (AVX-512, KC 336), NC 512 in place of
// 1024 took 0.93-0.98 of the time at 2048^3 to 3072^3 and 0.91 for a batch-256 4096 x 4096 layer.
// AVX-512's KC: each k block is a pass over C (a load and a store of every tile), so fewer, deeper
// blocks pay as long as the A micro-panel (14 x KC) still fits L1 beside the B lines streaming past.
// On a 2 MiB L2, float32 KC 640 (35 KB micro-panels) in place of 336 ran 1.02-1.04x as fast on one
// thread (1024^3 to 4096^3) and 1.02-1.07x on two (squares, layers of batch 64 and 256, im2col's
// shapes); 704 lost 2-3% on two threads at 2048^3 and 4096^3, and 1024 (micro-panels past L1) 3%
// at 3072^3 and 4096^3. float64 KC 320 in place of 192: 1.02-1.05x, im2col's shapes level.
// A deeper KC (the table's kc_alone) where the product runs alone, on one thread with dnnkit set to one
// thread, and C outgrows L2 (deep_k_blocks). What stops KC on two threads is L3, not L1: a deeper block
// means a narrower B block (NC from L2) and so more passes over the shared A block, which both threads
// stream from L3 at once. One thread alone streams it at half that rate and keeps the saving, one pass
// over C per k block fewer: float32 KC 1024 on AVX-512 ran 1.00-1.02x as fast as 640 on squares 1024 to
// 4096 (2048^3: 83.7% -> 85.3% of the FMA peak), 1.02x on 4096 x 1024 x 1024 (two threads at 4096^3:
// 0.95x); float64 512 in place of 320, 1.03-1.04x. A product on A blocks packed ahead of time
// (pack_a_blocks) keeps the table's KC: its layout cannot depend on the thread count.
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
};

// The largest NC up to the table's, a multiple of 32 columns (of every micro-kernel's NR), whose kc x NC
// block of `elem` bytes fills at most two thirds of L2; never under 128 columns.
inline index_t nc_for_l2(const Blocking& b, index_t kc, index_t elem) {
  const index_t fit = static_cast<index_t>(l2_cache_bytes()) * 2 / 3 / (std::max<index_t>(kc, 1) * elem) / 32 * 32;
  return std::max<index_t>(128, std::min(b.nc, fit));
}

template <typename T>
inline Blocking blocking_for(Isa isa) {
  constexpr bool f32 = sizeof(T) == 4;
  switch (isa) {
    //                      MC   KC   NC (the cap), KC alone
    case Isa::avx512: return f32 ? Blocking{4116, 640, 1024, 1024} : Blocking{2016, 320, 768, 512};
    case Isa::avx2:   return f32 ? Blocking{2016, 256, 1024, 256} : Blocking{2016, 256, 512, 256};
    default:          return f32 ? Blocking{1024, 256, 512, 256} : Blocking{1024, 256, 256, 256};
  }
}

// Whether an m x n product of `elem`-byte values on `nthreads` threads takes kc_alone: it runs alone (on
// one thread, with dnnkit set to one thread, so no other dnnkit thread shares L3 with it) and its C
// outgrows L2, so that every k block is a pass over C in memory. (A C that stays in L2 gains nothing from
// fewer passes and loses the A micro-panel from L1: 196 x 256 x 2304 ran 0.98x as fast on KC 768.)
inline bool deep_k_blocks(index_t m, index_t n, index_t elem, int nthreads) {
  return nthreads == 1 && get_num_threads() == 1 &&
         double(m) * double(n) * double(elem) > double(l2_cache_bytes());
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
