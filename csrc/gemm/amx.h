// float32 products on Intel AMX tiles, to float32 accuracy ("bf16x6").
//
// Each float32 x is split into three bfloat16 parts, x = x0 + x1 + x2 exactly: x0 = bf16(x) (nearest),
// x1 = bf16(x - x0), x2 = bf16(x - x0 - x1); |x1| <= 2^-9 |x| and |x2| <= 2^-17 |x|. (A panels from rows
// contiguous in depth cut x1 to 8 bits instead of rounding it, which is cheaper there: |x2| < 2^-16 |x|,
// and the parts still sum to x exactly.) A product a*b is
// summed as the six part products whose order is 2^-16 or larger,
//   a0 b0 + a0 b1 + a1 b0 + a0 b2 + a1 b1 + a2 b0,
// each exact in float32 (8 x 8 significant bits), accumulated by the tile unit in float32 with round to
// nearest even. What is left out, a1 b2 + a2 b1 + a2 b2, is at most about 2^-23 |a b|: the order of the
// rounding of the product in a float32 FMA, and far below the k-term sum's rounding. So the results
// carry float32's error, not bfloat16's (tests/test_amx.py checks it against float64 with the float32
// tolerances of the FMA kernels).
//
// What the tile unit does not do, and how it is kept out: it treats subnormal inputs as zero and
// flushes subnormal results, and an infinity's parts (inf, NaN, ...) would turn inf * 1 into NaN. So a
// product runs here only when every value of both operands is zero or has 2^-100 <= |x| < 3.39e38
// (splittable; all three parts are then normal and the split is exact); any other value (Inf, NaN,
// a subnormal or tiny value, one that would round past bfloat16's largest) sends the whole product to
// the FMA kernels. Results of magnitude below 2^-126 are flushed to zero.
//
// The tile unit runs 16 x 16 x 32 bfloat16 products per instruction at 16 cycles: 1024 FLOPs a cycle,
// 16 times the AVX-512 FMA peak. Six products per float32 product leave 2.7 times that peak, of which
// the float32 products reach about two thirds in L1 (bench/log/2026-11-22-to-24.md, AMX).
//
// Layout (tile_step_elems bfloat16 per step of 32 in depth, steps k-major, the depth padded with zeros):
//   A panel, 32 rows:    [step][part 0..2][row tile 0..1][16 rows][32 depth]
//   B panel, 32 columns: [step][part 0..2][column tile 0..1][16 depth pairs][16 columns][2]
// (B in the tile unit's pair-interleaved layout: element (2p + e, j) at pair row p, position 2j + e.)
// Rows and columns past the operand's are zero. Every part of a step is 1 KiB, a tile.
#pragma once
#include <cstdint>

#include "../common.h"
#include "gemm.h"

namespace dnnkit {
namespace amx {

using bf16 = std::uint16_t;
constexpr int kBlock = 32;                    // rows of an A panel, columns of a B panel
constexpr int kStep = 32;                     // depth of a step
constexpr index_t kStepElems = 3 * 32 * 32;  // bfloat16 per step of a panel

// Whether the kernels may use the tiles: max_level() is amx (the CPU and the OS run AMX-BF16 tiles and
// AVX512-BF16, this build has the tile kernels, and DNNKIT_ISA does not cap them; cpu_info.h).
bool available();
// available(), unless turned off: DNNKIT_AMX=0 in the environment at first use, or set_enabled(false).
bool enabled();
// Turns the tile path on or off; on where !available() throws std::invalid_argument.
void set_enabled(bool on);
// Whether the kernels take the tiles now: enabled(), with the kernels at the AVX-512 level (set_isa
// lowers it to reach the other kernels, and the tiles with it). Every caller of the tile path asks this.
bool active();

inline index_t steps(index_t k) { return ceil_div(k, index_t(kStep)); }
inline index_t panel_elems(index_t k) { return steps(k) * kStepElems; }

// Whether every value of the m x n view (element (r, c) at x[r*rs + c*cs]) is zero or has
// 2^-100 <= |x| < 0x1.fefp127 (see above).
bool splittable(index_t m, index_t n, const float* x, index_t rs, index_t cs);

// rows <= 32 rows of A (element (r, p) at a[r*rs + p*cs]), depth k, into one A panel.
void pack_a_panel(int rows, index_t k, const float* a, index_t rs, index_t cs, bf16* dst);
// One step of an A panel: rows <= 32 rows of kk <= 32 values, row r at a + r*rs (contiguous); the rest
// of the step zero. (An RNN's post-GEMM writes h_t a block of 32 hidden units at a time, one step of
// the next product's A panels.)
void pack_a_step(int rows, index_t kk, const float* a, index_t rs, bf16* step);
// A panels of rows contiguous in depth (row r at a + r*rs), as pack_a_panel makes them, split a row of
// one step (32 values) at a time, so that the split can ride between the tile products of another
// panel (tile_t's `side`): the vector units split while the tile unit multiplies. A cell on weights in
// place splits its next gate's rows while the tiles run this gate's. A panel is walked a step at a
// time, its 32 rows at each (32 streams that advance together read faster than one row after another).
// Whether every value was splittable is checked on the way (a weight split at every call is read
// once): where not, the panels hold what the split made of them, and a product on them is not
// float32's.
class SplitQueue {
 public:
  static constexpr int kMaxPanels = 4;
  SplitQueue() { clear(); }
  // Empties the queue and starts a new splittability check.
  void clear();
  // Queues rows <= 32 rows of depth k (row r at a + r*rs) into the A panel at dst.
  void add(int rows, index_t k, const float* a, index_t rs, bf16* dst);
  // Row steps left to split (32 for each step of a queued panel: rows past `rows` are zero-filled).
  index_t left() const { return left_; }
  // Splits up to n more row steps.
  void run(index_t n);
  // Splits what is left; whether every value queued since clear() split exactly (splittable).
  bool finish() {
    run(left_);
    return ok();
  }
  bool ok() const;

 private:
  friend void split_rows(SplitQueue& q, index_t n);
  struct Panel {
    const float* a;
    index_t rs, k;
    int rows;
    bf16* dst;
  };
  Panel panels_[kMaxPanels];
  int npanels_, panel_;
  index_t row_, step_, left_;
  alignas(64) std::uint32_t umin_[16];  // the smallest |x| bits - 1 and the largest, lane by lane
  alignas(64) std::uint32_t umax_[16];
};

// cols <= 32 columns of B (element (p, j) at b[p*rs + j*cs]), depth k, into one B panel.
void pack_b_panel(index_t k, int cols, const float* b, index_t rs, index_t cs, bf16* dst);

// n columns of B as ceil(n/32) panels, panel jp at dst + jp*panel_stride (a row-major B is walked by rows).
void pack_b_panels(index_t k, index_t n, const float* b, index_t rs, index_t cs, bf16* dst, index_t panel_stride);

// The tile configuration of this thread, for its lifetime: construct one on every thread that calls
// tile(), before the calls. The outermost scope of a thread loads the configuration and releases the
// tiles at its end; scopes within it (a GEMM called from a loop already on tiles) change nothing.
class TileScope {
 public:
  TileScope();
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// For 0 <= i < m <= 32, 0 <= j < n <= 32, over `nsteps` steps of the panels a and b:
//   C(i, j) := alpha * sum A(i, p) B(p, j) + beta * C(i, j) [+ bias[j], or bias[i] with bias_rows]
// C(i, j) at c[i*rs_c + j*cs_c]; beta == 0: C is not read. A full tile (32 x 32, cs_c == 1, alpha 1, beta
// 0 or 1) runs in the tiles from load to store; any other goes through a 4 KiB buffer.
// With nsteps2 > 0, the sum goes on over a second pair of panels (a2, b2) before C is stored: [A | A2]
// times [B; B2] (an RNN cell's x W_ih^T + h W_hh^T) with one load and store of the tiles.
void tile(index_t nsteps, const bf16* a, const bf16* b, float* c, index_t rs_c, index_t cs_c, int m, int n,
          float alpha, float beta, const float* bias, bool bias_rows, index_t nsteps2 = 0, const bf16* a2 = nullptr,
          const bf16* b2 = nullptr);

// For 0 <= i < m <= 32, 0 <= j < n <= 32:  C(i, j) := sum A(i, p) B(p, j) [+ sum A2 B2] [+ bias[i]], stored
// transposed, C(i, j) at ct[j*ldct + i]. The sum starts from the bias, as tile()'s does. (An RNN cell with
// the weights as A, 32 hidden units' rows of them unpacked but for the split, and [x | h]^T as B: C^T is
// the batch-major pre-activations the post-GEMM reads.)
// With `side`, side_rows row steps of it are split after every four tile products (SplitQueue). With
// `accumulate`, the sum starts from C's values in ct instead of the bias (a sum over a second pair of
// panels run later gives the bits the one call with nsteps2 gives).
void tile_t(index_t nsteps, const bf16* a, const bf16* b, float* ct, index_t ldct, int m, int n, const float* bias,
            index_t nsteps2 = 0, const bf16* a2 = nullptr, const bf16* b2 = nullptr, SplitQueue* side = nullptr,
            int side_rows = 0, bool accumulate = false);

// The blocked GEMM on tiles, for gemm<float>: returns false, having done nothing, where the tile path
// does not take the product (not enabled, A packed ahead, B computed, a shape shape_fits refuses, or an
// operand not splittable); the caller then runs the FMA kernels. B packed ahead (GemmArgs::b_panels) is
// read from its panels, a grouped B (b_group_cols) group by group. Throws std::bad_alloc before its
// parallel region.
bool gemm(const GemmArgs<float>& g, int nthreads);
// GFLOP/s of bfloat16 products on `nthreads` threads' tile units, each running a loop of independent
// products for about `seconds` (0 where there are no tiles). A float32 product costs six of them.
double measure_peak_gflops(int nthreads, double seconds);
// Bytes of packing buffers gemm() allocates for an m x n x k product it would take (shapes only: the
// operands' values are not looked at), else 0.
index_t workspace_bytes(index_t m, index_t n, index_t k, int nthreads);

// ---- The driver's parts: its plan (amx.cpp, on every CPU) and its body (tiles_amx.cpp).
struct Plan {
  index_t kc;      // depth of a block, a multiple of kStep
  index_t mc, nc;  // rows of an A block, columns of a B block: multiples of 32
  int nthreads;
  bool split_n;    // each thread packs and runs its own B blocks (else the threads share one, split A)
  bool own_a;      // split_n with one B block a thread, each thread splitting every A panel itself
};
// a_rows: A's rows are contiguous in depth (cs == 1), the layout a split between the tile products reads.
Plan make_plan(index_t m, index_t n, index_t k, int nthreads, bool a_rows);
// Whether a product of this shape takes the tiles: with few rows or columns, packing the other operand
// into three parts costs more than the tiles save.
bool shape_fits(index_t m, index_t n, index_t k);
// gemm() past its checks, on plan p; false where an operand does not split (C untouched).
bool gemm_tiles(const GemmArgs<float>& g, const Plan& p);
// measure_peak_gflops past its check.
double tile_peak_gflops(int nthreads, double seconds);

}  // namespace amx
}  // namespace dnnkit
