#include "pto/op_registry.h"

#include <algorithm>
#include <mutex>

namespace pto {

const TensorType& InferContext::input(size_t i) const {
  if (!has_input(i)) throw ValueError(cat(where(), ": required input ", i, " is missing"));
  return inputs[i];
}

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    register_elementwise_ops(*r);
    register_nn_ops(*r);
    register_tensor_ops(*r);
    register_reduction_ops(*r);
    register_indexing_ops(*r);
    register_attention_ops(*r);
    register_quantization_ops(*r);
    register_loss_ops(*r);
    register_image_ops(*r);
    register_signal_ops(*r);
    register_recurrent_ops(*r);
    return r;
  }();
  return *registry;
}

void OpRegistry::add(OpDef def) {
  std::string name = def.name;
  PTO_CHECK(!name.empty()) << "OpDef without a name";
  def.id = static_cast<int32_t>(by_id_.size());
  auto [it, added] = defs_.emplace(name, std::move(def));
  PTO_CHECK(added) << "op '" << name << "' defined twice";
  by_id_.push_back(&it->second);
}

const OpDef& OpRegistry::by_id(int32_t id) const {
  PTO_CHECK(id >= 0 && static_cast<size_t>(id) < by_id_.size()) << "no op with id " << id;
  return *by_id_[static_cast<size_t>(id)];
}

const OpDef* OpRegistry::find(std::string_view name) const {
  auto it = defs_.find(std::string(name));
  return it == defs_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, def] : defs_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace pto
