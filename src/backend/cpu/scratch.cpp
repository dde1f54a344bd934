#include "backend/cpu/scratch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

#include "pto/error.h"

namespace pto::cpu {
namespace {

struct Slots {
  void* data[kScratchSlots] = {};
  size_t size[kScratchSlots] = {};
  ~Slots() {
    for (void* p : data) std::free(p);
  }
};

thread_local Slots t_slots;

}  // namespace

void* scratch(size_t bytes, int slot) {
  PTO_CHECK(slot >= 0 && slot < kScratchSlots) << "scratch slot " << slot << " out of range";
  if (bytes > t_slots.size[slot]) {
    std::free(t_slots.data[slot]);
    t_slots.data[slot] = nullptr;
    t_slots.size[slot] = 0;
    size_t rounded = (bytes + (bytes >> 3) + 4095) / 4096 * 4096;  // 12% headroom, whole pages
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw ValueError(cat("out of memory allocating ", bytes, " bytes of kernel scratch"));
    t_slots.data[slot] = p;
    t_slots.size[slot] = rounded;
  }
  return t_slots.data[slot];
}

ScratchBuffer::~ScratchBuffer() {
  std::free(p_);
}

void* ScratchBuffer::get(size_t bytes) {
  bytes = ((bytes ? bytes : 1) + 63) / 64 * 64;
  if (bytes > cap_) {
    std::free(p_);
    p_ = std::aligned_alloc(64, bytes);
    cap_ = p_ ? bytes : 0;
    if (!p_) throw ValueError(cat("out of memory allocating a ", bytes, "-byte kernel buffer"));
  }
  return p_;
}

std::shared_ptr<uint8_t[]> panel_memory(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const bool huge = bytes >= kHuge;
  const size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* m = nullptr;  // posix_memalign: a size that is not a multiple of the alignment
  if (posix_memalign(&m, huge ? kHuge : 64, size) != 0)
    throw ValueError(cat("out of memory allocating ", bytes, " bytes of packed panels"));
  if (huge) madvise(m, size, MADV_HUGEPAGE);  // a hint: small pages where the kernel has none
  std::memset(m, 0, size);                    // and the pages faulted in now, not on the first call
  return std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(m), [](uint8_t* q) { std::free(q); });
}

}  // namespace pto::cpu
