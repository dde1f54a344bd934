// MemoryPool: a caching allocator in size classes (64-byte steps up to 4 KiB, then eight steps per
// power of two, so at most 12.5% is wasted), with the ACL-style allocation flags.
//
// Blocks of 2 MiB and more taken with kAllocHugeFirst are 2 MiB aligned and advised to use huge
// pages; they are cached apart (their key is the class plus one; classes are multiples of 64), so a
// later huge-first request gets a huge-page block again. A plain request may take either kind.
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "pto/error.h"
#include "pto/runtime.h"

namespace pto {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;

// A block's cache key: its class, plus one for a huge-page block (recognized by its alignment).
size_t cache_key(size_t cls, const void* p) {
  bool huge = cls >= kHugePage && reinterpret_cast<uintptr_t>(p) % kHugePage == 0;
  return cls + (huge ? 1 : 0);
}

}  // namespace

MemoryPool::MemoryPool(AllocFlags default_flags) : default_flags_(default_flags) {}

MemoryPool::~MemoryPool() {
  release_cached();
}

size_t MemoryPool::size_class(size_t nbytes) {
  nbytes = std::max<size_t>(nbytes, 1);
  if (nbytes <= 4096) return (nbytes + 63) / 64 * 64;
  size_t step = std::bit_floor(nbytes) / 8;
  return (nbytes + step - 1) / step * step;
}

void* MemoryPool::allocate(size_t nbytes, AllocFlags flags) {
  if (nbytes > max_tensor_bytes())
    throw ValueError(cat("allocation of ", nbytes, " bytes exceeds the limit of ",
                         max_tensor_bytes(), " bytes"));
  size_t cls = size_class(nbytes);
  void* p = nullptr;
  {
    std::lock_guard lock(mutex_);
    bool want_huge = (flags & kAllocHugeFirst) && cls >= kHugePage;
    for (size_t key : {cls + 1, cls}) {
      if (key == cls && want_huge) break;  // a huge-first request only takes huge-page blocks
      auto it = free_.find(key);
      if (it == free_.end() || it->second.empty()) continue;
      p = it->second.back();
      it->second.pop_back();
      break;
    }
    if (p) {
      ++stats_.pool_hits;
      stats_.in_use_bytes += cls;
      stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    }
  }
  if (!p) {
    // From the system, outside the lock; counted once it succeeded.
    bool huge = (flags & kAllocHugeFirst) && cls >= kHugePage;
    size_t align = huge ? kHugePage : kTensorAlignment;
    p = std::aligned_alloc(align, (cls + align - 1) / align * align);
    if (!p) throw ValueError(cat("out of memory allocating ", nbytes, " bytes"));
    if (huge) madvise(p, cls, MADV_HUGEPAGE);  // a hint: falls back to small pages silently
    if ((flags & kAllocPrefetch) && !(flags & kAllocZero))
      for (size_t off = 0; off < cls; off += kPage) static_cast<volatile char*>(p)[off] = 0;
    std::lock_guard lock(mutex_);
    ++stats_.system_allocations;
    stats_.reserved_bytes += cls;
    stats_.in_use_bytes += cls;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  if (flags & kAllocZero) std::memset(p, 0, nbytes);
  return p;
}

void MemoryPool::deallocate(void* p, size_t nbytes) noexcept {
  if (!p) return;
  size_t cls = size_class(nbytes);
  std::lock_guard lock(mutex_);
  stats_.in_use_bytes -= cls;
  try {
    free_[cache_key(cls, p)].push_back(p);
  } catch (...) {
    // No memory left to cache it (a Loop's scan output grew until allocation failed): the block
    // goes back to the system. A tensor's destructor calls this, so it must not throw.
    std::free(p);
    stats_.reserved_bytes -= cls;
  }
}

void MemoryPool::release_cached() {
  std::lock_guard lock(mutex_);
  for (auto& [key, blocks] : free_) {
    for (void* p : blocks) std::free(p);
    stats_.reserved_bytes -= (key & ~size_t{1}) * blocks.size();
  }
  free_.clear();
}

MemoryPoolStats MemoryPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

namespace {

// The pools Executables took (weakly: a pool dies with its last executable and tensor), and the
// shared one while enable_memory_pool is on.
struct Pools {
  std::mutex mutex;
  std::vector<std::weak_ptr<MemoryPool>> all;
  std::shared_ptr<MemoryPool> shared;
};

Pools& pools() {
  static Pools* p = new Pools;  // never destroyed: pools may outlive static destruction order
  return *p;
}

}  // namespace

void enable_memory_pool(bool enabled) {
  Pools& p = pools();
  std::lock_guard lock(p.mutex);
  if (!enabled) {
    p.shared.reset();
  } else if (!p.shared) {
    p.shared = std::make_shared<MemoryPool>(kAllocHugeFirst);
    p.all.push_back(p.shared);
  }
}

bool memory_pool_enabled() {
  Pools& p = pools();
  std::lock_guard lock(p.mutex);
  return p.shared != nullptr;
}

std::shared_ptr<MemoryPool> executable_memory_pool() {
  Pools& p = pools();
  std::lock_guard lock(p.mutex);
  if (p.shared) return p.shared;
  std::erase_if(p.all, [](const std::weak_ptr<MemoryPool>& w) { return w.expired(); });
  auto pool = std::make_shared<MemoryPool>(kAllocHugeFirst);
  p.all.push_back(pool);
  return pool;
}

MemoryPoolStats memory_stats() {
  std::vector<std::shared_ptr<MemoryPool>> live;
  {
    Pools& p = pools();
    std::lock_guard lock(p.mutex);
    for (const auto& w : p.all)
      if (auto pool = w.lock()) live.push_back(std::move(pool));
  }
  MemoryPoolStats total;
  for (const auto& pool : live) {
    const MemoryPoolStats s = pool->stats();
    total.reserved_bytes += s.reserved_bytes;
    total.in_use_bytes += s.in_use_bytes;
    total.peak_in_use_bytes += s.peak_in_use_bytes;
    total.system_allocations += s.system_allocations;
    total.pool_hits += s.pool_hits;
  }
  return total;
}

}  // namespace pto
