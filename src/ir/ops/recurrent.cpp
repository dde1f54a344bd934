// Recurrent layers: RNN, GRU and LSTM (ONNX semantics: gate order, layouts, directions,
// sequence_lens, peepholes, configurable activations).
#include "infer_util.h"

namespace pto {
namespace {

// Y is [seq, dirs, batch, hidden] (layout 0) or [batch, seq, dirs, hidden] (layout 1); Y_h and
// Y_c are [dirs, batch, hidden] or [batch, dirs, hidden].
void infer_recurrent(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  const int64_t hidden = c.attrs().get_int("hidden_size", -1);
  const int64_t dirs = c.node.attr_string("direction") == "bidirectional" ? 2 : 1;
  const bool batch_first = c.node.attr_int("layout") == 1;
  std::optional<Shape> y, state;
  if (x.shape && x.shape->size() == 3 && hidden > 0) {
    Dim seq = (*x.shape)[batch_first ? 1 : 0], batch = (*x.shape)[batch_first ? 0 : 1];
    y = batch_first ? Shape{batch, seq, dirs, hidden} : Shape{seq, dirs, batch, hidden};
    state = batch_first ? Shape{batch, dirs, hidden} : Shape{dirs, batch, hidden};
  }
  infer::set(c, 0, x.dtype, y);
  for (size_t i = 1; i < c.outputs.size(); ++i) infer::set(c, i, x.dtype, state);
}

void add(OpRegistry& r, const char* name, int max_inputs, int max_outputs,
         std::initializer_list<AttrDef> more) {
  const AttrSchema common = {
      optional_attr("activation_alpha", AttrKind::kFloats),
      optional_attr("activation_beta", AttrKind::kFloats),
      optional_attr("activations", AttrKind::kStrings, "absent: the op's defaults"),
      optional_attr("clip", AttrKind::kFloat, "absent: no clipping"),
      {"direction", "forward", "forward, reverse or bidirectional"},
      optional_attr("hidden_size", AttrKind::kInt, "absent: from the weights"),
      {"layout", int64_t{0}, "opset 14+: 1 for batch-major"},
      optional_attr("output_sequence", AttrKind::kInt, "opset 1 only")};
  r.add({.name = name,
         .min_inputs = 3,
         .max_inputs = max_inputs,
         .min_outputs = 0,
         .max_outputs = max_outputs,
         .properties = kOpaque,
         .attrs = common.with(more),
         .infer = infer_recurrent});
}

}  // namespace

void register_recurrent_ops(OpRegistry& r) {
  add(r, "RNN", 6, 2, {});
  add(r, "GRU", 6, 2, {{"linear_before_reset", int64_t{0}}});
  add(r, "LSTM", 8, 3, {{"input_forget", int64_t{0}}});
}

}  // namespace pto
