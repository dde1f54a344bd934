// The data-movement kernel families that live in their own files; register_movement_kernels
// (movement.cpp) calls each.
#pragma once

#include <cstdint>

#include "backend/cpu/kernel.h"
#include "pto/error.h"

namespace pto::cpu {

// Calls f.template operator()<U>() with U the unsigned integer of `itemsize` bytes: kernels that
// move elements without looking at them need only the size.
template <class F>
decltype(auto) with_element_size(size_t itemsize, F&& f) {
  switch (itemsize) {
    case 1:
      return f.template operator()<uint8_t>();
    case 2:
      return f.template operator()<uint16_t>();
    case 4:
      return f.template operator()<uint32_t>();
    case 8:
      return f.template operator()<uint64_t>();
    default:
      throw InternalError(cat("unsupported element size ", itemsize));
  }
}

void register_gather_kernels(
    KernelRegistry& r);  // gather.cpp: Gather, GatherElements, GatherND, ReverseSequence
void register_pad_kernels(KernelRegistry& r);             // pad.cpp: Pad
void register_scatter_kernels(KernelRegistry& r);         // scatter.cpp: ScatterElements, ScatterND
void register_gather_channels_kernel(KernelRegistry& r);  // gather_channels.cpp: GatherChannels

}  // namespace pto::cpu
