// Runs one op through the Tensor Graph and the reference interpreter, for op tests: builds the
// node twice (inputs as graph inputs, then as initializers that inference can read), runs both,
// and checks that every shape dimension inference claims to know matches the result.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto::testing {

struct OpCall {
  std::string op;
  std::vector<Tensor> inputs;  // an undefined Tensor is a missing optional input
  Attributes attrs;
  size_t num_outputs = 1;
  int opset = 18;
};

inline void expect_inferred_matches(const Graph& g, const std::vector<Tensor>& outs) {
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorType& t = g.value(g.outputs()[i]).type;
    EXPECT_EQ(t.dtype, outs[i].dtype()) << "output " << i << " dtype";
    if (!t.shape) continue;
    ASSERT_EQ(t.shape->size(), outs[i].shape().size())
        << "output " << i << ": inferred " << t.str() << ", got " << outs[i].str();
    for (size_t k = 0; k < t.shape->size(); ++k) {
      if ((*t.shape)[k].is_known()) {
        EXPECT_EQ((*t.shape)[k].value, outs[i].shape()[k])
            << "output " << i << ": inferred " << t.str() << ", got " << outs[i].str();
      }
    }
  }
}

inline std::vector<Tensor> run_once(const OpCall& call, bool as_constants) {
  Graph g;
  std::vector<ValueId> ins;
  std::vector<Tensor> feeds;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const Tensor& t = call.inputs[i];
    if (!t.defined()) {
      ins.push_back(kNoValue);
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    if (as_constants) {
      ins.push_back(g.add_value(name));
      g.set_initializer(ins.back(), t);
    } else {
      ins.push_back(g.add_input(name, {t.dtype(), to_shape(t.shape())}));
      feeds.push_back(t);
    }
  }
  std::vector<ValueId> outs;
  for (size_t i = 0; i < call.num_outputs; ++i)
    outs.push_back(g.add_value("out" + std::to_string(i)));
  g.add_node(call.op, ins, outs, call.attrs, "node0", call.opset);
  for (ValueId v : outs) g.add_output(v);
  verify(g);
  infer_types(g);
  std::vector<Tensor> result = reference::run(g, feeds);
  expect_inferred_matches(g, result);
  return result;
}

// Runs the op both ways; returns the outputs (the two runs must agree exactly).
inline std::vector<Tensor> run_op(const OpCall& call) {
  std::vector<Tensor> a = run_once(call, false);
  std::vector<Tensor> b = run_once(call, true);
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].shape(), b[i].shape());
    for (int64_t j = 0; j < a[i].numel() && a[i].shape() == b[i].shape(); ++j) {
      double x = a[i].item_as_double(j), y = b[i].item_as_double(j);
      EXPECT_TRUE(x == y || (x != x && y != y)) << "output " << i << " element " << j;
    }
  }
  return a;
}

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.item_as_double(i);
  return v;
}

// The message of the pto::Error `f` throws, as type E; fails the test when it throws nothing.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// Small builders the op tests share.
inline Attributes attrs(std::initializer_list<std::pair<std::string, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}
inline Tensor f32(std::vector<float> v, Dims s) {
  return Tensor::from_vector<float>(v, std::move(s));
}
inline Tensor i64(std::vector<int64_t> v, Dims s) {
  return Tensor::from_vector<int64_t>(v, std::move(s));
}

}  // namespace pto::testing
