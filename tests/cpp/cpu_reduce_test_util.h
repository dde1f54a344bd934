// Shared by the CPU reduction, normalization and pooling kernel tests: runs one node through
// pto::compile (level 0) on every ISA with 1 and 2 threads and compares each output with the
// reference interpreter's, within a tolerance stated per test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/isa/isa.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto::testing {

struct NodeCase {
  std::string op;
  std::vector<Tensor> inputs;  // undefined: a missing optional input
  Attributes attrs;
  int opset = 18;
  size_t num_outputs = 1;
  std::vector<bool> constant;  // per input: an initializer rather than a graph input
};

// |got - want| <= atol + rtol * max(|want|, scale), scale per output element (0 when not given);
// NaN must meet NaN and infinities must be equal.
struct Tol {
  double rtol = 0, atol = 0;
};

inline Graph one_node(const NodeCase& c, std::vector<Tensor>* feeds) {
  Graph g;
  std::vector<ValueId> ins, outs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (!t.defined()) {
      ins.push_back(kNoValue);
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    if (i < c.constant.size() && c.constant[i]) {
      ins.push_back(g.add_value(name));
      g.set_initializer(ins.back(), t);
    } else {
      ins.push_back(g.add_input(name, {t.dtype(), to_shape(t.shape())}));
      feeds->push_back(t);
    }
  }
  for (size_t i = 0; i < c.num_outputs; ++i) outs.push_back(g.add_value("out" + std::to_string(i)));
  g.add_node(c.op, ins, outs, c.attrs, "node0", c.opset);
  for (ValueId v : outs) g.add_output(v);
  infer_types(g);
  return g;
}

inline std::string describe(const NodeCase& c) {
  std::ostringstream s;
  s << c.op << " opset " << c.opset << " on";
  for (const Tensor& t : c.inputs) s << " " << (t.defined() ? t.str() : "-");
  return s.str();
}

// Compares the run of `exe` (compiled from g) with the reference's on every ISA and 1 and 2
// threads. `scale` (optional, per output 0 element) widens the tolerance of sums.
inline void expect_runs_match(const Graph& g, const Executable& exe,
                              const std::vector<Tensor>& feeds, Tol tol,
                              const std::vector<double>& scale = {}) {
  const std::vector<Tensor> want = reference::run(g, feeds);
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const std::vector<Tensor> got = exe.run(feeds);
      ASSERT_EQ(got.size(), want.size());
      for (size_t o = 0; o < got.size(); ++o) {
        ASSERT_EQ(got[o].shape(), want[o].shape()) << "output " << o;
        ASSERT_EQ(got[o].dtype(), want[o].dtype()) << "output " << o;
        int bad = 0;
        for (int64_t i = 0; i < got[o].numel() && bad < 5; ++i) {
          const double a = got[o].item_as_double(i), b = want[o].item_as_double(i);
          const double s = o == 0 && !scale.empty() ? scale[i] : 0.0;
          const bool ok = std::isnan(b) ? std::isnan(a)
                          : std::isinf(b)
                              ? a == b
                              : std::fabs(a - b) <= tol.atol + tol.rtol * std::max(std::fabs(b), s);
          if (!ok) {
            ++bad;
            ADD_FAILURE() << cpu::isa_name(isa) << ", " << threads << " thread(s), output " << o
                          << " element " << i << ": got " << a << ", want " << b;
          }
        }
      }
    }
  }
  set_num_threads(0);
}

// Compiles the one-node graph of `c` (level 0), expects node 0 to run on `backend` and compares
// it with the reference (expect_runs_match).
inline void expect_matches(const NodeCase& c, Tol tol, const std::vector<double>& scale = {},
                           const std::string& backend = "cpu") {
  SCOPED_TRACE(describe(c));
  std::vector<Tensor> feeds;
  Graph g = one_node(c, &feeds);
  Executable exe = compile(g, {.level = 0});
  ASSERT_EQ(exe.node_backend(0), backend);
  expect_runs_match(g, exe, feeds, tol, scale);
}

// Uniform floats in [lo, hi) from a fixed seed.
inline Tensor random_f32(Dims shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

// Writes NaN, +inf and -inf at a few fixed positions.
inline Tensor with_specials(Tensor t) {
  const float specials[] = {NAN, INFINITY, -INFINITY};
  for (int64_t i = 0, k = 0; i < t.numel(); i += 7, ++k) t.data<float>()[i] = specials[k % 3];
  return t;
}

inline Tensor ints(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_vector<int64_t>(v, {n});
}

// One unit in the last place of float at 1: tolerances are written as multiples of it.
inline constexpr double kUlp = 1.1920928955078125e-07;

}  // namespace pto::testing
