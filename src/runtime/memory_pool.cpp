// MemoryPool: a caching allocator in size classes (64-byte steps up to 4 KiB, then eight steps per
// power of two, so at most 12.5% is wasted), with the ACL-style allocation flags.
#include <sys/mman.h>

#include <bit>
#include <cstdlib>
#include <cstring>

#include "pto/error.h"
#include "pto/runtime.h"

namespace pto {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;

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
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      ++stats_.pool_hits;
    } else {
      ++stats_.system_allocations;
      stats_.reserved_bytes += cls;
    }
    stats_.in_use_bytes += cls;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  if (!p) {
    bool huge = (flags & kAllocHugeFirst) && cls >= kHugePage;
    size_t align = huge ? kHugePage : kTensorAlignment;
    p = std::aligned_alloc(align, (cls + align - 1) / align * align);
    if (!p) {
      std::lock_guard lock(mutex_);
      stats_.in_use_bytes -= cls;
      stats_.reserved_bytes -= cls;
      throw ValueError(cat("out of memory allocating ", nbytes, " bytes"));
    }
    if (huge) madvise(p, cls, MADV_HUGEPAGE);  // a hint: falls back to small pages silently
    if ((flags & kAllocPrefetch) && !(flags & kAllocZero))
      for (size_t off = 0; off < cls; off += kPage) static_cast<volatile char*>(p)[off] = 0;
  }
  if (flags & kAllocZero) std::memset(p, 0, nbytes);
  return p;
}

void MemoryPool::deallocate(void* p, size_t nbytes) {
  if (!p) return;
  size_t cls = size_class(nbytes);
  std::lock_guard lock(mutex_);
  free_[cls].push_back(p);
  stats_.in_use_bytes -= cls;
}

void MemoryPool::release_cached() {
  std::lock_guard lock(mutex_);
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) std::free(p);
    stats_.reserved_bytes -= cls * blocks.size();
  }
  free_.clear();
}

MemoryPoolStats MemoryPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace pto
