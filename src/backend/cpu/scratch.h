// Per-thread scratch memory for kernels (packed GEMM panels, im2col columns): grow-only, 64-byte
// aligned, kept for the life of the thread, so a kernel's workspace is paid for once and
// steady-state runs touch no allocator and take no page faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

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

// A grow-only, 64-byte aligned buffer a kernel owns (as a thread_local), for workspaces that
// callers holding the slots above must not lose: the GEMMs' packed panels, which a convolution
// asks for while its im2col columns sit in a slot.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* get(size_t bytes);  // at least `bytes` (1 when 0); the contents go when it grows
  template <class T>
  T* get_as(size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

// A zeroed, 64-byte aligned buffer for constant operands packed once and read every call (weight
// panels), on transparent huge pages (2 MiB, MADV_HUGEPAGE: the system's THP setting is often
// "madvise") where it spans one; the tail short of 2 MiB stays on small pages. Panels that stream
// from memory each call pay a TLB miss every 4 KiB on small pages, and the hardware prefetchers
// stop at each 4 KiB page: onnxruntime-genai's int8 Llama layer 15.8 -> 13.6 ms a token
// (docs/precision.md), BERT-base's fp32 weights (docs/backend/gemm.md).
std::shared_ptr<uint8_t[]> panel_memory(size_t bytes);

}  // namespace pto::cpu
