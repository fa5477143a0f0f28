// Work sharing between the threads of one OpenMP parallel region.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "common.h"

namespace dnnkit {

// An exception cannot leave an OpenMP region (it would end the process). Work inside one runs through
// run(): the first exception is kept, every thread then skips the work it has left (worksharing loops
// still complete, so no barrier waits on a thread that stopped), and the caller rethrows it after the
// region with rethrow().
class RegionErrors {
 public:
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  template <typename F>
  void run(F&& f) noexcept {
    if (failed()) return;
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

// Units of work (panels of a GEMM, steps of an RNN's time loop) shared by the threads of a parallel
// region. Each thread owns an equal range and takes units from its front; a thread whose range is empty
// takes units from the back of the others'. With cores of equal speed every thread runs its own range,
// as a static split would, and keeps its data in its own cache and its memory streams contiguous; when
// one core runs slower (a busy sibling hyperthread, a shared virtual machine, a hybrid CPU's small
// core), the others finish its work instead of waiting at the region's barrier. Ranges come in two
// sets, for work that repeats (an RNN's steps): a thread resets its range of the next round's set
// before the barrier that ends this round, when no thread can be reading it any more.
class PanelShare {
 public:
  static constexpr index_t kMaxPanels = index_t(1) << 31;  // a range is two 32-bit indices
  PanelShare(int nt, index_t panels) : nt_(nt), panels_(panels), slots_(new Slot[2 * std::max(nt, 1)]) {
    for (int set = 0; set < 2; ++set)
      for (int tid = 0; tid < nt; ++tid) reset(set, tid);
  }
  void reset(int set, int tid) {
    const Share s = even_share(panels_, tid, nt_);
    const auto lo = static_cast<std::uint64_t>(s.lo), hi = static_cast<std::uint64_t>(s.hi);
    slot(set, tid).store(lo | hi << 32, std::memory_order_relaxed);
  }
  // The next panel for thread tid in `set`: from its own range, else from another's; -1 when none is left.
  // `reverse` runs the own range from its back and takes from the front of the others'. Work that
  // streams the same data every round (an RNN's weights) alternates it: a round then starts on the
  // panels the last round touched last, which are still in the core's cache.
  index_t next(int set, int tid, bool reverse = false) {
    index_t jp = take(slot(set, tid), reverse);
    for (int k = 1; jp < 0 && k < nt_; ++k) jp = take(slot(set, (tid + k) % nt_), !reverse);
    return jp;
  }

 private:
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> range{0};  // front in the low 32 bits, back (exclusive) in the high 32
  };
  std::atomic<std::uint64_t>& slot(int set, int tid) { return slots_[set * nt_ + tid].range; }
  static index_t take(std::atomic<std::uint64_t>& r, bool back) {
    std::uint64_t v = r.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint64_t lo = v & 0xffffffffu, hi = v >> 32;
      if (lo >= hi) return -1;
      const std::uint64_t nv = back ? (lo | (hi - 1) << 32) : ((lo + 1) | hi << 32);
      if (r.compare_exchange_weak(v, nv, std::memory_order_relaxed)) return static_cast<index_t>(back ? hi - 1 : lo);
    }
  }
  int nt_;
  index_t panels_;
  std::unique_ptr<Slot[]> slots_;
};

// The units of [0, units) this thread of a parallel region gets, one at a time (next(): -1 when none is
// left): from `share` (set 0) when there is one, else the thread's equal range of a static split (the
// range PanelShare starts it on); either way its own range from the back when `reverse`. A loop that
// starts on its next unit's work before it has finished this one's asks for the unit early.
class UnitCursor {
 public:
  UnitCursor(PanelShare* share, index_t units, bool reverse) : share_(share), reverse_(reverse), tid_(thread_id()) {
    if (!share) {
      const Share s = even_share(units, tid_, thread_count());
      lo_ = s.lo;
      hi_ = s.hi;
    }
  }
  index_t next() {
    if (share_) return share_->next(0, tid_, reverse_);
    if (lo_ >= hi_) return -1;
    return reverse_ ? --hi_ : lo_++;
  }

 private:
  PanelShare* share_;
  bool reverse_;
  int tid_;
  index_t lo_ = 0, hi_ = 0;
};

// Runs fn(u) for each unit a UnitCursor gives this thread.
template <typename F>
void for_each_unit(PanelShare* share, index_t units, bool reverse, F&& fn) {
  UnitCursor cursor(share, units, reverse);
  for (index_t u; (u = cursor.next()) >= 0;) fn(u);
}

// Which way a product that streams a weight W should run through it this time: alternately forwards and
// backwards for each W (one bit per slot of a small table keyed by W's address; two weights sharing a slot
// only lose the alternation). Back-to-back calls on the same W, a layer or a cell run in a loop, then
// start on the part of W the last call read last, which is still in cache.
inline bool alternate_direction(const void* key) {
  static std::atomic<unsigned char> bits[256];  // static storage: zero before first use
  const std::uint64_t h = (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(key)) >> 6) * 0x9E3779B97F4A7C15ull;
  return bits[h >> 56].fetch_xor(1, std::memory_order_relaxed) != 0;
}

}  // namespace dnnkit
