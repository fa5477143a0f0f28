// Cache blocking for the GEMM driver: one table, one row per (ISA, dtype). MR and NR come from the
// micro-kernel (ukernel_<isa>.cpp); MC, KC, NC are chosen so that
//   - a packed A micro-panel (MR x KC) stays in L1 while the B micro-panels stream past it,
//   - the packed B block (KC x NC) stays in L2 (about half of it, leaving room for C and A),
//   - the packed A block (MC x KC) stays in L3, shared by the threads.
#pragma once
#include "../common.h"
#include "../cpu_info.h"

namespace dnnkit {

struct Blocking {
  index_t mc;
  index_t kc;
  index_t nc;
};

template <typename T>
inline Blocking blocking_for(Isa isa) {
  constexpr bool f32 = sizeof(T) == 4;
  switch (isa) {
    //                      MC   KC    NC
    case Isa::avx512: return f32 ? Blocking{2016, 336, 1024} : Blocking{2016, 192, 768};
    case Isa::avx2:   return f32 ? Blocking{2016, 256, 1024} : Blocking{2016, 256, 512};
    default:          return f32 ? Blocking{1024, 256, 512} : Blocking{1024, 256, 256};
  }
}

}  // namespace dnnkit
