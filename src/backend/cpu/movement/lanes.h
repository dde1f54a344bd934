// The lane shuffle under GatherChannels on the channel-blocked layout (gather_channels.cpp), per
// ISA for 4-byte elements: each output block of c lanes takes its lanes from up to c source
// blocks, the same lanes at every pixel.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// One source block of an output block: the output lanes it fills (`mask`, bit l for lane l) and,
// for each of them, the lane of the source it reads.
struct LaneSource {
  const uint32_t* src = nullptr;  // lane 0 of the source block at the first pixel
  uint32_t mask = 0;
  int32_t lane[16] = {};
};

// dst[p * block + l] = parts[k].src[p * block + parts[k].lane[l]] where bit l of parts[k].mask is
// set (at most one part sets it), 0 where none does; for p < pixels. block <= 16; a block of the
// ISA's vector width (16 lanes for AVX-512, 8 for AVX2) takes a masked permute per part and pixel,
// any other a scalar loop.
PTO_ISA_DECLARE(void gather_lanes_4(const LaneSource* parts, int64_t num_parts, uint32_t* dst,
                                    int64_t block, int64_t pixels);)

}  // namespace pto::cpu
