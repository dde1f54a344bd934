// Small Loop models in the IR's text form, shared by the control-flow and tuner tests.
#pragma once

#include <string>

#include "pto/error.h"

namespace pto::testing {

// Two iterations of x = Sigmoid(x) + b, b an outer value the body captures: one elementwise tile
// kernel in the body (what tile pins and tuned knobs act on).
inline const char* kLoopSigmoidAdd = R"(graph main (opset 17)
  input  %x: f32[7, 100]
  input  %b: f32[100]
  const  %m: i64[] = [2]
  %y: f32[7, 100] = Loop(%m, _, %x, %b) {body=graph}  # loop
    body: graph body (opset 17)
      input  %i: i64[]
      input  %c: bool[]
      input  %x_in: f32[7, 100]
      capture %b_in: f32[100]
      %s: f32[7, 100] = Sigmoid(%x_in)  # sig
      %x_out: f32[7, 100] = Add(%s, %b_in)  # add
      return %c, %x_out
  return %y
)";

// Three iterations of x = Relu(x @ w) on an [rows, n] x, w the constant [n, n] of `weights` (the
// text of its values, "[...]") that the body captures.
inline std::string matmul_relu_loop(int rows, int n, const std::string& weights) {
  const std::string x = cat("f32[", rows, ", ", n, "]"), w = cat("f32[", n, ", ", n, "]");
  return cat("graph main (opset 17)\n  input  %x: ", x, "\n  const  %m: i64[] = [3]\n",
             "  const  %w: ", w, " = ", weights, "\n", "  %y: ", x,
             " = Loop(%m, _, %x, %w) {body=graph}  # loop\n",
             "    body: graph body (opset 17)\n      input  %i: i64[]\n",
             "      input  %c: bool[]\n      input  %x_in: ", x, "\n      capture %w_in: ", w,
             "\n      %p: ", x, " = MatMul(%x_in, %w_in)  # mm\n      %x_out: ", x,
             " = Relu(%p)  # relu\n      return %c, %x_out\n  return %y\n");
}

}  // namespace pto::testing
