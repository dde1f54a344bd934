// The 2-D transpose at the heart of Transpose (strided_copy.cpp's transpose loop), per ISA for
// 4-byte elements; other sizes use a scalar blocked loop in strided_copy.cpp.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// dst[a * dst_ld + b] = src[a + b * src_ld] for a < rows, b < cols (elements of 4 bytes): a strip
// of `rows` destination rows, read as `cols` source rows of `rows` contiguous elements.
PTO_ISA_DECLARE(void transpose_strip_4(const uint32_t* src, int64_t src_ld, uint32_t* dst,
                                       int64_t dst_ld, int64_t rows, int64_t cols);)

}  // namespace pto::cpu
