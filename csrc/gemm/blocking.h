// Cache blocking for the GEMM driver: one table, one row per (ISA, dtype). MR and NR come from the
// micro-kernel (ukernel_<isa>.cpp); MC, KC, NC are chosen so that
//   - a packed B micro-panel (KC x NR) stays in L1 while the A block streams past it,
//   - the packed A block (MC x KC) stays in L2,
//   - the packed B block (KC x NC) stays in L3.
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
    case Isa::avx512: return f32 ? Blocking{144, 384, 4096} : Blocking{144, 192, 2048};
    case Isa::avx2:   return f32 ? Blocking{168, 256, 4080} : Blocking{72, 256, 2040};
    default:          return f32 ? Blocking{128, 256, 2048} : Blocking{64, 256, 2048};
  }
}

}  // namespace dnnkit
