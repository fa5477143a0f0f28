// The recycled blocks of AlignedBuffer (common.h).
#include <cstdlib>
#ifdef __unix__
#include <pthread.h>
#endif
#include <mutex>
#include <string>
#include <vector>

#include "common.h"

namespace dnnkit {
namespace {

struct Block {
  void* p;
  std::size_t bytes, align;
};

struct BlockCache {
  std::mutex mu;
  std::vector<Block> blocks;  // oldest first
  std::size_t held = 0;
  std::size_t budget = 0;

  BlockCache() {
    std::size_t mb = 256;
    if (const char* e = std::getenv("DNNKIT_BLOCK_CACHE_MB")) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(e, &end, 10);
      if (e[0] >= '0' && e[0] <= '9' && *end == '\0') mb = static_cast<std::size_t>(v);  // else the default
    }
    budget = mb > (SIZE_MAX >> 20) ? SIZE_MAX : mb << 20;
  }
};

constexpr std::size_t kMaxBlocks = 256;

BlockCache* g_cache = nullptr;

BlockCache& cache() {
  static BlockCache* c = [] {
    g_cache = new BlockCache();  // never destroyed: buffers may be freed during exit
#ifdef __unix__
    // A fork while another thread holds the lock would leave the child's copy locked for good: hold it
    // across the fork, and release it on both sides.
    pthread_atfork([] { g_cache->mu.lock(); }, [] { g_cache->mu.unlock(); }, [] { g_cache->mu.unlock(); });
#endif
    return g_cache;
  }();
  return *c;
}

}  // namespace

void* block_cache_take(std::size_t bytes, std::size_t align, std::size_t* got) {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  // The smallest block that fits; of several, the one given back last, whose lines are likeliest to be
  // in cache still.
  const std::size_t none = c.blocks.size();
  std::size_t best = none;
  for (std::size_t i = c.blocks.size(); i-- > 0;) {
    const std::size_t b = c.blocks[i].bytes;
    if (b >= bytes && b / 2 <= bytes && c.blocks[i].align >= align && (best == none || b < c.blocks[best].bytes))
      best = i;
  }
  if (best == none) return nullptr;
  const Block blk = c.blocks[best];
  c.blocks.erase(c.blocks.begin() + static_cast<std::ptrdiff_t>(best));
  c.held -= blk.bytes;
  *got = blk.bytes;
  return blk.p;
}

void block_cache_give(void* p, std::size_t bytes, std::size_t align) {
  if (!p) return;
  BlockCache& c = cache();
  std::vector<void*> drop;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (bytes > c.budget) {
      drop.push_back(p);
    } else {
      // The oldest blocks make room, in bytes and in count (each take searches them all).
      while (c.held + bytes > c.budget || c.blocks.size() >= kMaxBlocks) {
        drop.push_back(c.blocks.front().p);
        c.held -= c.blocks.front().bytes;
        c.blocks.erase(c.blocks.begin());
      }
      try {
        c.blocks.push_back(Block{p, bytes, align});
        c.held += bytes;
      } catch (const std::bad_alloc&) {
        drop.push_back(p);
      }
    }
  }
  for (void* q : drop) std::free(q);
}

std::size_t block_cache_release() {
  BlockCache& c = cache();
  std::vector<Block> blocks;
  std::size_t held;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    blocks.swap(c.blocks);
    held = c.held;
    c.held = 0;
  }
  for (const Block& b : blocks) std::free(b.p);
  return held;
}

std::size_t block_cache_bytes() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.held;
}

}  // namespace dnnkit
