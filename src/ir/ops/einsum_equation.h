// Parsing Einsum equations ("bij,bjk->bik", "...ii->...i", implicit "ij,jk"), shared by shape
// inference and the reference kernel.
#pragma once

#include <string>
#include <vector>

#include "pto/shape.h"

namespace pto::einsum {

// Labels are small ints: 0..51 for a-z, A-Z; 52 + k for the k-th broadcast (ellipsis) dimension,
// counted from the left of the longest ellipsis, so ellipses of different lengths right-align.
inline constexpr int kEllipsisBase = 52;
inline constexpr int kMaxLabels = kEllipsisBase + 64;

struct Equation {
  std::vector<std::vector<int>> inputs;  // one label per axis of each operand
  std::vector<int> output;               // one label per output axis
};

// Parses `eq` for operands of the given ranks. Throws ValueError naming `where` on a malformed
// equation, an operand whose rank does not match its subscripts, or an output label that no
// input has.
Equation parse(const std::string& eq, const std::vector<int64_t>& ranks, const std::string& where);

// The size of every label given the operands' shapes, -1 for labels not used. Sizes of 1
// broadcast; any other mismatch throws ValueError.
std::vector<int64_t> label_sizes(const Equation& e, const std::vector<Dims>& shapes,
                                 const std::string& where);

}  // namespace pto::einsum
