// PTO_VERIFY_PASSES (verify_passes.h). The inputs are random from a fixed seed (floats in
// [-1, 1), integers in [0, 10)), with each symbolic dimension at 2, or inside its declared range.
// The original graph is run once, and each pass's output once more unless the pass left the graph
// structurally unchanged: one reference run of the model per pass that rewrote something
// (docs/debugging.md has measurements).
#include "passes/verify_passes.h"

#include <cstdlib>
#include <map>
#include <random>

#include "pto/compare.h"
#include "pto/log.h"
#include "pto/random_tensor.h"
#include "pto/reference.h"

namespace pto::passes {
namespace {

double tolerance(const char* var, double fallback) {
  const char* s = std::getenv(var);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  const double x = std::strtod(s, &end);
  if (*end || !(x >= 0) || x == HUGE_VAL)
    throw ValueError(cat(var, ": expected a non-negative number, got '", s, "'"));
  return x;
}

}  // namespace

std::optional<PassVerifier> PassVerifier::from_env(const Graph& original) {
  const char* on = std::getenv("PTO_VERIFY_PASSES");
  if (!on || !*on || std::string(on) == "0") return std::nullopt;
  if (std::string(on) != "1")
    throw ValueError(cat("PTO_VERIFY_PASSES: expected 1 (on) or 0 (off), got '", on, "'"));
  PassVerifier v;
  v.rtol_ = tolerance("PTO_VERIFY_PASSES_RTOL", v.rtol_);
  v.atol_ = tolerance("PTO_VERIFY_PASSES_ATOL", v.atol_);
  std::mt19937_64 rng(0);
  for (ValueId id : original.inputs()) {
    const Value& in = original.value(id);
    if (in.type.dtype == DType::kUndefined || !in.type.shape) {
      log(LogLevel::kWarn, cat("PTO_VERIFY_PASSES: input '", in.name,
                               "' has no declared type or shape; the passes are not verified"));
      return std::nullopt;
    }
    Dims dims;
    for (const Dim& d : *in.type.shape) {
      int64_t size = d.is_known() ? d.value : 2;
      if (d.is_symbolic()) {
        auto r = original.symbol_ranges.find(d.symbol);
        if (r != original.symbol_ranges.end())
          size = std::clamp<int64_t>(size, r->second.min, r->second.max);
      }
      dims.push_back(size);
    }
    v.inputs_.push_back(random_tensor(in.type.dtype, dims, rng));
  }
  v.expected_ = reference::run(original, v.inputs_);
  for (ValueId o : original.outputs()) v.names_.push_back(original.value(o).name);
  return v;
}

void PassVerifier::check(const std::string& pass, const Graph& g) const {
  const std::vector<Tensor> got = reference::run(g, inputs_);
  if (got.size() != expected_.size())
    throw ValueError(cat("PTO_VERIFY_PASSES: pass ", pass, " changed the number of outputs from ",
                         expected_.size(), " to ", got.size()));
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string what = cat("PTO_VERIFY_PASSES: pass ", pass, ", output '", names_[i], "'");
    if (got[i].dtype() != expected_[i].dtype() || got[i].shape() != expected_[i].shape())
      throw ValueError(cat(what, ": is ", got[i].str(), ", was ", expected_[i].str()));
    const TensorDiff d = compare(got[i], expected_[i], rtol_, atol_, what);
    if (!d.ok())
      throw ValueError(cat(what, ": changed the result beyond tolerance (rtol ", rtol_, ", atol ",
                           atol_, "): ", describe(d, got[i].shape())));
  }
  log(LogLevel::kInfo, cat("PTO_VERIFY_PASSES: pass ", pass, ": outputs unchanged"));
}

}  // namespace pto::passes
