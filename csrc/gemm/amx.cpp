// The tile path's parts that run on every CPU: the switch, the driver's plan and workspace, and the
// checks made before any code compiled for the tiles runs (tiles_amx.cpp, or where the build has no
// tile kernels, stubs that are never reached).
#include "amx.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include "ukernel.h"

namespace dnnkit {
namespace amx {

namespace {
std::atomic<int> g_enabled{-1};  // -1: not yet decided
}  // namespace

bool available() { return max_level() == Level::amx; }

bool enabled() {
  int e = g_enabled.load(std::memory_order_relaxed);
  if (e < 0) {
    const char* env = std::getenv("DNNKIT_AMX");
    e = available() && !(env && env[0] == '0') ? 1 : 0;
    g_enabled.store(e, std::memory_order_relaxed);
  }
  return e == 1;
}

void set_enabled(bool on) {
  if (on && !available()) {
    const char* why = cpu_level() != Level::amx    ? "this CPU or OS does not run AMX-BF16 tiles"
                      : built_level() != Level::amx ? "this build of dnnkit has no AMX kernels"
                                                    : "DNNKIT_ISA caps the kernels below amx";
    throw std::invalid_argument(std::string("set_amx: ") + why);
  }
  g_enabled.store(on ? 1 : 0);
}

bool active() { return enabled() && active_isa() == Isa::avx512; }

Plan make_plan(index_t m, index_t n, index_t k, int nthreads, bool a_rows) {
  Plan p;
  // Depth blocks of at most 1024 (each block is one load and store of C's tiles, a pause of the tile
  // unit's pipeline: the fewer the better), equal, in whole steps.
  const index_t nsteps = steps(k), nkb = ceil_div(nsteps, 32);
  p.kc = ceil_div(nsteps, nkb) * kStep;
  const index_t panel_bytes = p.kc / kStep * kStepElems * index_t(sizeof(bf16));  // one 32-wide panel
  // B block: half of L2 (its panels stream from there past each A panel); A block: 8 MiB of L3, or a
  // quarter of a smaller one.
  const index_t l3 = static_cast<index_t>(l3_cache_bytes());
  const index_t a_bytes = l3 > 0 ? std::min(index_t(8) << 20, l3 / 4) : index_t(8) << 20;
  const index_t nc_cap = std::max<index_t>(1, static_cast<index_t>(l2_cache_bytes()) / 2 / panel_bytes) * 32;
  const index_t mc_cap = std::max<index_t>(1, a_bytes / panel_bytes) * 32;
  p.mc = round_up(ceil_div(m, ceil_div(m, mc_cap)), 32);
  const index_t panels_m = ceil_div(m, 32), panels_n = ceil_div(n, 32);
  int nt = std::max(1, nthreads);
  nt = static_cast<int>(std::min<index_t>(nt, panels_m * panels_n));
  if (double(m) * double(n) * double(k) < 4 * min_parallel_work()) nt = 1;
  p.nthreads = nt;
  p.split_n = nt == 1 || panels_n >= 2 * nt || panels_n >= panels_m;
  index_t njb = ceil_div(n, nc_cap);
  if (p.split_n) njb = round_up(njb, nt);
  p.nc = round_up(ceil_div(n, njb), 32);
  // One B block a thread: each thread runs every A panel against its block, and splits the panel after
  // the one its tiles run into a second buffer between their products (SplitQueue): the vector units
  // split while the tile unit multiplies, in L2, where a shared A block split ahead goes through L3 and
  // back. Each thread then splits all of A, which the tiles hide from a depth of 4 steps
  // (bench/log/2026-11-22-to-24.md, AMX).
  p.own_a = p.split_n && a_rows && njb == nt && k >= 4 * kStep;
  return p;
}

// From a depth of 128; under 192, only with 512 columns or more: shallower, the load and store of C's
// tiles a depth block and each thread's split of every A panel (own_a) over few columns cost more than
// the tiles save.
bool shape_fits(index_t m, index_t n, index_t k) {
  return std::min(m, n) >= 192 && k >= 128 && (k >= 192 || n >= 512);
}

index_t workspace_bytes(index_t m, index_t n, index_t k, int nthreads) {
  if (!active() || !shape_fits(m, n, k)) return 0;
  index_t bytes = 0;
  for (bool a_rows : {false, true}) {  // the larger of the two plans
    const Plan p = make_plan(m, n, k, nthreads > 0 ? nthreads : get_num_threads(), a_rows);
    const index_t panel = p.kc / kStep * kStepElems;
    const index_t a_panels = p.own_a ? 2 * p.nthreads : p.mc / 32;
    bytes = std::max(bytes, (a_panels + p.nc / 32 * (p.split_n ? p.nthreads : 1)) * panel * index_t(sizeof(bf16)));
  }
  return bytes;
}

bool gemm(const GemmArgs<float>& g, int nthreads) {
  if (!active() || g.a_packed || g.pack_b || !shape_fits(g.m, g.n, g.k)) return false;
  // B packed ahead for the FMA kernels is read in place where its panels are the tiles' 32 columns wide.
  if (g.b_panels && select_ukernel<float>(active_isa()).nr != kBlock) return false;
  return gemm_tiles(g, make_plan(g.m, g.n, g.k, nthreads > 0 ? nthreads : get_num_threads(), g.cs_a == 1));
}

double measure_peak_gflops(int nthreads, double seconds) { return available() ? tile_peak_gflops(nthreads, seconds) : 0.0; }

void SplitQueue::clear() {
  npanels_ = panel_ = 0;
  row_ = step_ = left_ = 0;
  std::fill(umin_, umin_ + 16, ~0u);
  std::fill(umax_, umax_ + 16, 0u);
}

void SplitQueue::add(int rows, index_t k, const float* a, index_t rs, bf16* dst) {
  if (npanels_ == kMaxPanels) throw std::logic_error("amx::SplitQueue: more panels than it holds");
  panels_[npanels_++] = Panel{a, rs, k, rows, dst};
  left_ += index_t(kBlock) * steps(k);
}

#if !DNNKIT_HAVE_AMX
// No tile kernels in this build: available() is false, so nothing below is reached.
namespace {
[[noreturn]] void no_tiles(const char* what) {
  throw std::logic_error(std::string(what) + ": this build of dnnkit has no AMX kernels");
}
}  // namespace
bool splittable(index_t, index_t, const float*, index_t, index_t) { return false; }
void pack_a_step(int, index_t, const float*, index_t, bf16*) { no_tiles("amx::pack_a_step"); }
void pack_a_panel(int, index_t, const float*, index_t, index_t, bf16*) { no_tiles("amx::pack_a_panel"); }
void pack_b_panel(index_t, int, const float*, index_t, index_t, bf16*) { no_tiles("amx::pack_b_panel"); }
void pack_b_panels(index_t, index_t, const float*, index_t, index_t, bf16*, index_t) { no_tiles("amx::pack_b_panels"); }
void SplitQueue::run(index_t) { no_tiles("amx::SplitQueue"); }
bool SplitQueue::ok() const { return false; }
TileScope::TileScope() {}
TileScope::~TileScope() {}
void tile(index_t, const bf16*, const bf16*, float*, index_t, index_t, int, int, float, float, const float*, bool,
          index_t, const bf16*, const bf16*) {
  no_tiles("amx::tile");
}
void tile_t(index_t, const bf16*, const bf16*, float*, index_t, int, int, const float*, index_t, const bf16*,
            const bf16*, SplitQueue*, int, bool) {
  no_tiles("amx::tile_t");
}
bool gemm_tiles(const GemmArgs<float>&, const Plan&) { no_tiles("amx::gemm"); }
double tile_peak_gflops(int, double) { return 0.0; }
#endif

}  // namespace amx
}  // namespace dnnkit
