// Shape values: the contents of the small integer vectors that shape arithmetic builds
// (Shape -> Gather -> Concat -> Reshape), one Dim per element, symbols included. Type inference
// propagates them so a Reshape or Expand whose target is computed at run time still gets a shape
// with the model's symbolic dims (batch, seq) instead of unknowns; ResolveShapes uses the same
// values to give such targets constants.
#pragma once

#include <optional>
#include <vector>

#include "pto/graph.h"

namespace pto {

struct ShapeValue {
  // What is known of one element beyond its Dim.
  struct Element {
    // An exact integer (a -1 in dims is a real -1, as Reshape's "infer this one"), not a symbol
    // or an unknown. Per element because exporters mix the two in one vector: Concat(batch,
    // [-1], seq, seq) as an Expand target.
    bool exact = false;
    // A dimension's size, or sums and products of sizes: never negative even where the value is
    // unknown (the length of Concat(past, new) along the cache axis).
    bool size = false;
    // The size of `tensor` along `axis` (an element of Shape(tensor), wherever it travels), so an
    // unknown length can still be matched to the dimension it measures; kNoValue otherwise.
    ValueId tensor = kNoValue;
    int64_t axis = 0;
  };

  Shape dims;                     // one per element; Dim::unknown() where not known
  bool scalar = false;            // a 0-D tensor (a Gather by a scalar index)
  std::vector<Element> elements;  // one per element

  bool is_exact(size_t i) const { return i < elements.size() && elements[i].exact; }
  // Provably >= 0: a size, a symbol, or an exact non-negative literal.
  bool never_negative(size_t i) const;
  bool literal() const;  // every element exact
};

// The value of a constant integer (or boolean: 0 and 1) tensor of rank <= 1 and at most 64
// elements.
std::optional<ShapeValue> shape_value_of_constant(const Tensor& t);

// The value of a node's single output from its inputs' types and values (nullptr: not known),
// for the ops shape arithmetic uses: Shape, Size, Identity, integer Cast, Gather (axis 0), Slice
// (axis 0, step 1), Concat (axis 0), Unsqueeze/Squeeze of a scalar or 1-element vector, and
// Add/Sub/Mul/Div of two values, Equal (booleans as 0 and 1), Where on a known condition and a
// Reshape to rank 0 or 1.
// nullopt for every other op.
std::optional<ShapeValue> evaluate_shape_value(const Node& n,
                                               const std::vector<TensorType>& input_types,
                                               const std::vector<const ShapeValue*>& inputs);

}  // namespace pto
