// Shared helpers for the CPU kernels: aligned buffers, threading, error types.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

namespace dnnkit {

using index_t = std::int64_t;

// Alignment of every packed buffer: one cache line, which is also one AVX-512 vector.
constexpr std::size_t kAlign = 64;
// Buffers of this size or more are aligned to 2 MiB and asked to be backed by huge pages: a fresh
// buffer (glibc maps every allocation over 32 MiB anew) would otherwise take a page fault per 4 KiB
// on first touch, every call. NumPy does the same for its large arrays.
constexpr std::size_t kHugeBytes = std::size_t(4) << 20;
constexpr std::size_t kHugeAlign = std::size_t(2) << 20;
// Buffers from this size up (glibc's first threshold for mapping an allocation apart from its heap) are
// recycled, aligned to a page below kHugeBytes. glibc maps such a buffer afresh, or hands back the top
// of its heap and grows it again, depending on what the process allocated before, and each new page
// faults on first touch (bench/fresh_process.py counts the faults a call).
constexpr std::size_t kRecycleBytes = std::size_t(128) << 10;
constexpr std::size_t kPageAlign = 4096;

// Blocks of kRecycleBytes or more are recycled: a freed one is kept, up to a process-wide budget
// (DNNKIT_BLOCK_CACHE_MB, default 256; 0 keeps none), and handed to the next request it fits (at most
// twice the size asked for, aligned at least as asked), so an operator called again and again (an RNN's
// per-call buffers) neither maps fresh pages nor has the kernel zero them on every call. Thread-safe.
// block_cache_take returns a block of at least `bytes`, aligned to `align`, and sets *got to its size,
// or null; block_cache_give keeps or frees a block from block_cache_take or std::aligned_alloc(align).
void* block_cache_take(std::size_t bytes, std::size_t align, std::size_t* got);
void block_cache_give(void* p, std::size_t bytes, std::size_t align);
// Frees every kept block; returns the bytes released.
std::size_t block_cache_release();
// Bytes now kept.
std::size_t block_cache_bytes();

// An owning, aligned, uninitialised buffer of T. Throws std::bad_alloc (MemoryError in Python).
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t n) { resize(n); }
  ~AlignedBuffer() { release(); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Grows (never shrinks) to hold n elements; contents are not preserved.
  void resize(std::size_t n) {
    if (n <= cap_) return;
    release();
    if (n > (SIZE_MAX - kHugeAlign) / sizeof(T)) throw std::bad_alloc();
    const std::size_t want = n * sizeof(T);
    const std::size_t align = want >= kHugeBytes ? kHugeAlign : want >= kRecycleBytes ? kPageAlign : kAlign;
    std::size_t bytes = (want + align - 1) / align * align;
    void* p = align != kAlign ? block_cache_take(bytes, align, &bytes) : nullptr;
    if (!p) {
      p = std::aligned_alloc(align, bytes);
      if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      if (align == kHugeAlign) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
    }
    ptr_ = static_cast<T*>(p);
    cap_ = bytes / sizeof(T);
    bytes_ = bytes;
    align_ = align;
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }

 private:
  void release() {
    if (align_ != kAlign) block_cache_give(ptr_, bytes_, align_);
    else std::free(ptr_);
    ptr_ = nullptr;
    cap_ = bytes_ = 0;
    align_ = kAlign;
  }
  T* ptr_ = nullptr;
  std::size_t cap_ = 0, bytes_ = 0, align_ = kAlign;
};

// Multiply-adds below which a product runs on one thread (default 2^17): waking the other threads and
// meeting them at the end costs a few microseconds, as long as such a product takes on one core. Tests
// set it to 0 so that small shapes reach the multi-threaded code.
double min_parallel_work();
void set_min_parallel_work(double fmas);
// Bytes of output from which a kernel that only writes it stores it past the caches (non-temporal
// stores): the last-level cache's size (L3, else L2), at most 16 L2 caches' worth (an output larger than
// that has left a shared L3 to the other cores' work by the time it is read, and plain stores would read
// each of its lines from memory first). A smaller output stays in the cache, where plain stores write it
// faster and its reader finds it (bench/log/2026-11-27-sapphire-rapids.md). Tests lower it (any
// value; negative: the default) to reach the streaming stores.
double past_caches_bytes();
void set_past_caches_bytes(double bytes);

inline index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }
inline index_t round_up(index_t a, index_t b) { return ceil_div(a, b) * b; }

// Thread tid's part [lo, hi) of `units` split among nt threads: the parts differ by at most one unit,
// the larger ones last, so that a partial last unit (a GEMM's short last panel) lies in a larger part.
struct Share {
  index_t lo, hi;
};
inline Share even_share(index_t units, int tid, int nt) { return {units * tid / nt, units * (tid + 1) / nt}; }

// Rank of the calling thread in the innermost OpenMP team (0 outside one, or without OpenMP).
inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Size of the innermost OpenMP team (1 outside one, or without OpenMP).
inline int thread_count() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// Number of threads kernels use; set from Python (dnnkit.set_num_threads), 1 to kMaxThreads. The bound
// keeps a mistyped count from reaching OpenMP, which aborts the process when it cannot create a thread.
constexpr int kMaxThreads = 1024;
int get_num_threads();
void set_num_threads(int n);

}  // namespace dnnkit
