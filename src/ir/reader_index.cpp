// ReaderIndex (pto/reader_index.h): the readers of every value in one flat array (compressed
// rows): count the readers per value, prefix-sum the counts into offsets, then fill in node order
// so that each value's readers come out ascending.
#include "pto/reader_index.h"

namespace pto {

ReaderIndex::ReaderIndex(const Graph& g)
    : offsets_(g.values().size() + 1, 0), outputs_(g.values().size(), 0) {
  const auto& nodes = g.nodes();
  for (const Node& n : nodes)
    for (ValueId v : n.inputs)
      if (v != kNoValue) ++offsets_[v + 1];
  for (size_t v = 0; v + 1 < offsets_.size(); ++v) offsets_[v + 1] += offsets_[v];
  readers_.resize(static_cast<size_t>(offsets_.back()));
  std::vector<int32_t> next(offsets_.begin(), offsets_.end() - 1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (ValueId v : nodes[i].inputs)
      if (v != kNoValue) readers_[next[v]++] = static_cast<int32_t>(i);
  for (ValueId v : g.outputs()) ++outputs_[v];
}

std::span<const int32_t> ReaderIndex::readers(ValueId v) const {
  return {readers_.data() + offsets_[v], static_cast<size_t>(offsets_[v + 1] - offsets_[v])};
}

int ReaderIndex::uses(ValueId v) const {
  return offsets_[v + 1] - offsets_[v] + outputs_[v];
}

bool ReaderIndex::is_output(ValueId v) const {
  return outputs_[v] != 0;
}

int32_t ReaderIndex::single_reader(ValueId v) const {
  if (v == kNoValue || outputs_[v] != 0 || offsets_[v + 1] - offsets_[v] != 1) return -1;
  return readers_[offsets_[v]];
}

}  // namespace pto
