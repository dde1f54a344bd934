// Who reads each value of a graph: the one "readers of a value" query that passes, fusion and the
// runtime share (the single reader of a value, the nodes that read it, whether it is an output).
//
//   const ReaderIndex readers(g);                  // O(values + node inputs), once per pass
//   int32_t r = readers.single_reader(v);          // O(1); -1 unless exactly one node reads v
//
// An index describes the graph as it was when built: a pass that rewrites the graph builds a new
// one after the change (passes/rewrite_util.h keeps one per rule firing). Kept in its own header
// rather than graph.h so that adding it did not rebuild every file that includes the graph.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pto/graph.h"

namespace pto {

class ReaderIndex {
 public:
  explicit ReaderIndex(const Graph& g);

  // The nodes that take `v` as an input, ascending, a node once per input it reads `v` through
  // (Mul(v, v) lists its node twice). Graph outputs are not nodes: see is_output.
  std::span<const int32_t> readers(ValueId v) const;
  // Node inputs and graph outputs that read `v`: Graph::use_counts()[v].
  int uses(ValueId v) const;
  // Whether `v` is a graph output (the caller of the graph reads it).
  bool is_output(ValueId v) const;
  // The node reading `v` when exactly one node input reads it and it is not a graph output, so
  // that node may consume it (fuse it, rewrite it away); -1 otherwise, and for kNoValue.
  int32_t single_reader(ValueId v) const;

 private:
  std::vector<int32_t> offsets_;  // readers of v: readers_[offsets_[v], offsets_[v + 1])
  std::vector<int32_t> readers_;
  std::vector<int32_t> outputs_;  // how many times v is listed as a graph output
};

}  // namespace pto
