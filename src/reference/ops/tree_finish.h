// What the tree ensembles and linear models of ai.onnx.ml do to their summed scores, as
// onnxruntime (and the ONNX reference, where they agree) computes it: base values, the post
// transform, and a classifier's label with onnxruntime's two-class rules. Shared by the reference
// kernels and the CPU kernel (backend/cpu/tree_ensemble.cpp), which differ only in how they walk
// the trees.
#pragma once

#include <cmath>
#include <cstdint>

#include "ir/ops/tree_ensemble.h"

namespace pto::reference::ml {

double probit(double p);  // sqrt(2) erfinv(2p - 1), erfinv by Winitzki's approximation
double logistic(double v);
// The post transform over n >= 2 scores in place (PROBIT and LOGISTIC per score).
void transform(trees::PostTransform post, double* v, int64_t n);

// Whether x takes interior node i's true branch (x and the threshold t in the comparison type).
template <class Th>
bool goes_true(const trees::Forest& f, size_t i, Th x, Th t) {
  using trees::Mode;
  if (std::isnan(x) && f.missing_true[i]) return true;
  switch (f.mode[i]) {
    case Mode::kLeq:
      return x <= t;
    case Mode::kLt:
      return x < t;
    case Mode::kGte:
      return x >= t;
    case Mode::kGt:
      return x > t;
    case Mode::kEq:
      return x == t;
    case Mode::kNeq:
      return x != t;
    case Mode::kMember:
      for (int64_t m = f.set_begin[i]; m < f.set_begin[i + 1]; ++m)
        if (x == static_cast<Th>(f.members[static_cast<size_t>(m)])) return true;
      return false;
  }
  return false;
}

// One row of a forest after its trees: `score` and `has` (whether any leaf reached the target)
// per target. Writes the row's n_targets outputs to `out` and, for a classifier, its label.
void finish_row(const trees::Forest& f, double* score, const uint8_t* has, double* out,
                int64_t* label);

}  // namespace pto::reference::ml
