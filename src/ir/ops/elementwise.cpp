// Elementwise op definitions: unary math and activations, binary arithmetic with broadcasting,
// comparisons and logic.
#include "infer_util.h"

namespace pto {
namespace {

void unary(OpRegistry& r, const std::string& name, uint32_t extra = 0) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kElementwise | kInPlace | extra,
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
}

void binary(OpRegistry& r, const std::string& name, uint32_t extra = 0) {
  r.add({.name = name,
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kBroadcast | kInPlace | extra,
         .infer = [](InferContext& c) { infer::broadcast(c); }});
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  for (const char* op : {"Relu", "Exp"}) unary(r, op);
  binary(r, "Add", kCommutative);
  binary(r, "Mul", kCommutative);
  binary(r, "Sub");
  binary(r, "Div");
}

}  // namespace pto
