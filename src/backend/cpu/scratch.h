// Per-thread scratch memory for kernels (packed GEMM panels, im2col columns): grow-only, 64-byte
// aligned, kept for the life of the thread, so a kernel's workspace is paid for once and
// steady-state runs touch no allocator and take no page faults.
#pragma once

#include <cstddef>

namespace pto::cpu {

// A buffer of at least `bytes` for `slot` (0..kScratchSlots-1) on the calling thread. The same slot
// returns the same memory until a larger request moves it; the contents are not kept across calls
// that grow it. Different slots never overlap, so a kernel can hold several at once.
inline constexpr int kScratchSlots = 4;
void* scratch(size_t bytes, int slot = 0);

template <class T>
T* scratch_as(size_t count, int slot = 0) {
  return static_cast<T*>(scratch(count * sizeof(T), slot));
}

}  // namespace pto::cpu
