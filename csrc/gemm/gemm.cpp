#include "gemm.h"

#include <algorithm>
#include <vector>

#include "blocking.h"
#include "pack.h"
#include "ukernel.h"

namespace dnnkit {
namespace {

// Loop structure (BLIS names):
//   jc: n in blocks of NC        -> pack B block (KC x NC), shared by all threads
//   pc: k in blocks of KC
//   ic: m in blocks of mc        -> pack A block (mc x KC)
//   jr: NR-wide micro-panels of B
//   ir: MR-tall micro-panels of A -> micro-kernel; epilogue on the tile after the last pc block
//
// Threads split the ic loop when m has enough rows (each thread packs its own A block), otherwise
// they share one packed A block and split the jr loop. The B block is packed cooperatively.

struct Plan {
  index_t mc, kc, nc;
  int mr, nr;
  int nthreads;
  bool split_m;  // true: threads split the ic loop; false: they split the jr loop
};

template <typename T>
Plan make_plan(index_t m, index_t n, index_t k, int nthreads, const UKernel<T>& uk) {
  const Blocking blk = blocking_for<T>(active_isa());
  Plan p;
  p.mr = uk.mr;
  p.nr = uk.nr;
  // Balance the last KC block: split k into equal-ish blocks rather than a full block and a sliver.
  index_t nkb = ceil_div(std::max<index_t>(k, 1), blk.kc);
  p.kc = round_up(ceil_div(std::max<index_t>(k, 1), nkb), 8);
  p.nc = std::min<index_t>(blk.nc, round_up(n, uk.nr));
  int nt = std::max(1, nthreads);
  // Never more threads than there is work for: a thread needs at least one MR x NR tile.
  index_t tiles = ceil_div(m, uk.mr) * ceil_div(std::min(n, p.nc), uk.nr);
  nt = static_cast<int>(std::min<index_t>(nt, std::max<index_t>(tiles, 1)));
  p.nthreads = nt;
  // Split m only when every thread gets a full MC block: below that, splitting n lets each thread pack
  // and consume only its own B panels (no B traffic between cores) and keeps the A block shared.
  p.split_m = m >= static_cast<index_t>(nt) * blk.mc;
  if (p.split_m) {
    // Equal blocks per thread: the number of ic blocks is a multiple of nt.
    index_t nb = round_up(ceil_div(m, blk.mc), nt);
    p.mc = round_up(ceil_div(m, nb), uk.mr);
  } else {
    p.mc = std::min<index_t>(blk.mc, round_up(m, uk.mr));
  }
  return p;
}

template <typename T>
void macro_kernel(const GemmArgs<T>& g, const UKernel<T>& uk, const T* ap, const T* bp, index_t ic, index_t mc,
                  index_t jc, index_t nc, index_t kc, T beta, bool last, index_t jr_begin, index_t jr_end) {
  const int mr = uk.mr, nr = uk.nr;
  const index_t n_ir = ceil_div(mc, mr);
  for (index_t jr = jr_begin; jr < jr_end; ++jr) {
    const index_t j = jc + jr * nr;
    const int n_t = static_cast<int>(std::min<index_t>(nr, jc + nc - j));
    const T* b_panel = bp + jr * nr * kc;
    for (index_t ir = 0; ir < n_ir; ++ir) {
      const index_t i = ic + ir * mr;
      const int m_t = static_cast<int>(std::min<index_t>(mr, ic + mc - i));
      T* c = g.c + i * g.rs_c + j * g.cs_c;
      uk.fn(kc, ap + ir * mr * kc, b_panel, c, g.rs_c, g.cs_c, g.alpha, beta, m_t, n_t);
      if (last && (g.bias || g.act != Activation::identity))
        apply_epilogue<T>(c, g.rs_c, g.cs_c, m_t, n_t, g.bias ? g.bias + (g.bias_per_row ? i : j) : nullptr, g.act,
                          g.bias_per_row);
    }
  }
}

// k == 0: the product is empty, C := beta*C (C unread when beta == 0), then the epilogue.
template <typename T>
void scale_c(const GemmArgs<T>& g) {
  for (index_t i = 0; i < g.m; ++i)
    for (index_t j = 0; j < g.n; ++j) {
      T* c = g.c + i * g.rs_c + j * g.cs_c;
      *c = g.beta == T(0) ? T(0) : g.beta * *c;
    }
  apply_epilogue<T>(g.c, g.rs_c, g.cs_c, g.m, g.n, g.bias, g.act, g.bias_per_row);
}

}  // namespace

template <typename T>
index_t gemm_workspace_bytes(index_t m, index_t n, index_t k, int nthreads) {
  if (m == 0 || n == 0 || k == 0) return 0;
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const Plan p = make_plan<T>(m, n, k, nthreads > 0 ? nthreads : get_num_threads(), uk);
  const index_t a_elems = round_up(p.mc, p.mr) * p.kc * (p.split_m ? p.nthreads : 1);
  const index_t b_elems = round_up(p.nc, p.nr) * p.kc;
  return (a_elems + b_elems) * static_cast<index_t>(sizeof(T));
}

template <typename T>
void gemm(const GemmArgs<T>& g, int nthreads) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    scale_c(g);
    return;
  }
  const UKernel<T> uk = select_ukernel<T>(active_isa());
  const Plan p = make_plan<T>(g.m, g.n, g.k, nthreads > 0 ? nthreads : get_num_threads(), uk);
  const index_t a_block = round_up(p.mc, p.mr) * p.kc;
  // Allocated before the parallel region: an exception must not cross it.
  AlignedBuffer<T> abuf(static_cast<std::size_t>(a_block * (p.split_m ? p.nthreads : 1)));
  AlignedBuffer<T> bbuf(static_cast<std::size_t>(round_up(p.nc, p.nr) * p.kc));
  T* const bp = bbuf.data();

#pragma omp parallel num_threads(p.nthreads) if (p.nthreads > 1)
  {
#ifdef _OPENMP
    const int tid = omp_get_thread_num();
    const int nt = omp_get_num_threads();
#else
    const int tid = 0;
    const int nt = 1;
#endif
    for (index_t jc = 0; jc < g.n; jc += p.nc) {
      const index_t nc = std::min(p.nc, g.n - jc);
      const index_t n_jr = ceil_div(nc, p.nr);
      for (index_t pc = 0; pc < g.k; pc += p.kc) {
        const index_t kc = std::min(p.kc, g.k - pc);
        const T beta = pc == 0 ? g.beta : T(1);
        const bool last = pc + kc >= g.k;
        // Pack the B block, NR-column micro-panels split across threads.
#pragma omp for schedule(static)
        for (index_t jr = 0; jr < n_jr; ++jr) {
          const index_t j = jc + jr * p.nr;
          pack_b_panel<T>(kc, std::min<index_t>(p.nr, jc + nc - j), g.b + pc * g.rs_b + j * g.cs_b, g.rs_b,
                          g.cs_b, p.nr, bp + jr * p.nr * kc);
        }  // implicit barrier: B block complete
        if (p.split_m) {
          T* ap = abuf.data() + tid * a_block;
          const index_t n_ic = ceil_div(g.m, p.mc);
          for (index_t ib = tid; ib < n_ic; ib += nt) {
            const index_t ic = ib * p.mc;
            const index_t mc = std::min(p.mc, g.m - ic);
            for (index_t ir = 0; ir < ceil_div(mc, p.mr); ++ir) {
              const index_t i = ic + ir * p.mr;
              pack_a_panel<T>(std::min<index_t>(p.mr, ic + mc - i), kc, g.a + i * g.rs_a + pc * g.cs_a, g.rs_a,
                              g.cs_a, p.mr, ap + ir * p.mr * kc);
            }
            macro_kernel<T>(g, uk, ap, bp, ic, mc, jc, nc, kc, beta, last, 0, n_jr);
          }
#pragma omp barrier
        } else {
          T* ap = abuf.data();
          for (index_t ic = 0; ic < g.m; ic += p.mc) {
            const index_t mc = std::min(p.mc, g.m - ic);
            const index_t n_ir = ceil_div(mc, p.mr);
#pragma omp for schedule(static)
            for (index_t ir = 0; ir < n_ir; ++ir) {
              const index_t i = ic + ir * p.mr;
              pack_a_panel<T>(std::min<index_t>(p.mr, ic + mc - i), kc, g.a + i * g.rs_a + pc * g.cs_a, g.rs_a,
                              g.cs_a, p.mr, ap + ir * p.mr * kc);
            }  // implicit barrier: A block complete
            const index_t chunk = ceil_div(n_jr, nt);
            const index_t jr0 = std::min(n_jr, tid * chunk), jr1 = std::min(n_jr, jr0 + chunk);
            macro_kernel<T>(g, uk, ap, bp, ic, mc, jc, nc, kc, beta, last, jr0, jr1);
#pragma omp barrier
          }
        }
      }
    }
  }
}

template void gemm<float>(const GemmArgs<float>&, int);
template void gemm<double>(const GemmArgs<double>&, int);
template index_t gemm_workspace_bytes<float>(index_t, index_t, index_t, int);
template index_t gemm_workspace_bytes<double>(index_t, index_t, index_t, int);

}  // namespace dnnkit
