// PTO_VERIFY_PASSES=1: after every graph pass, the reference interpreter runs the pass's output on
// fixed random inputs and compares it with the original graph's outputs; the first pass that
// changed a result beyond tolerance is a ValueError naming the pass, the output and the error.
// A pass whose output is structurally equal to its input (pto/graph.h) is not rerun.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pto/graph.h"

namespace pto::passes {

class PassVerifier {
 public:
  // A verifier when PTO_VERIFY_PASSES is set to 1 (nullopt when unset or 0; any other value is a
  // ValueError); runs `original` once for the expected outputs. PTO_VERIFY_PASSES_RTOL and
  // PTO_VERIFY_PASSES_ATOL set the tolerance (default 1e-3 and 1e-4).
  static std::optional<PassVerifier> from_env(const Graph& original);

  // Runs `g` (the output of `pass`) and compares; throws ValueError on the first output beyond
  // tolerance.
  void check(const std::string& pass, const Graph& g) const;

 private:
  std::vector<Tensor> inputs_, expected_;
  std::vector<std::string> names_;
  double rtol_ = 1e-3, atol_ = 1e-4;
};

}  // namespace pto::passes
