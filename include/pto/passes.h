// Graph passes (level 1 of DESIGN.md) and the pass manager that runs them.
//
// A pass is a named function Graph -> Graph (src/passes/<snake_name>.cpp, one per file, with a
// header comment stating its algorithm). The manager runs the pipeline of an optimization level,
// re-infers types and runs the verifier after every pass (a failure names the pass), times each
// pass, and prints the graph after the passes named in PTO_DUMP_AFTER (comma-separated, or "all").
//
//   Graph g2 = run_passes(std::move(g), {.level = 1});
//   PTO_DUMP_AFTER=FoldBatchNorm PTO_LOG=info pto compile model.onnx
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "pto/graph.h"
#include "pto/registry.h"

namespace pto {

// What a pass sees besides the graph; passes report what they did through note().
struct PassContext {
  int level = 2;
  DType mixed_precision = DType::kBF16;      // what AutoMixedPrecision marks products with
  std::string matmul_precision = "highest";  // PassOptions::matmul_precision (MatMulPrecision)
  std::string conv_precision = "highest";    // PassOptions::conv_precision (ConvPrecision)
  size_t max_folded_bytes = 0;               // PassOptions::max_folded_bytes
  // Rewrites that fired, by rule name ("FoldBatchNorm/Conv" -> 20); filled by note().
  mutable std::map<std::string, int> fired;
  void note(const std::string& rule, int count = 1) const { fired[rule] += count; }
};

using PassFn = std::function<Graph(Graph, const PassContext&)>;

struct PassDef {
  std::string name;  // "FoldBatchNorm": matches the file fold_batch_norm.cpp
  PassFn run;
  std::string doc;  // one line, for `pto compile --list-passes`
};

class PassRegistry {
 public:
  static PassRegistry& global();  // every built-in pass, registered on first use
  void add(PassDef def);          // a second pass of the same name is an InternalError
  const PassDef* find(const std::string& name) const { return passes_.find(name); }
  std::vector<std::string> names() const { return passes_.names_in_order(); }

 private:
  Registry<PassDef> passes_{"pass"};
};

// What one pass did to the graph.
struct PassReport {
  std::string name;
  double seconds = 0;
  size_t nodes_before = 0, nodes_after = 0;
  std::map<std::string, int> fired;
};

struct PassOptions {
  int level = 2;
  // AutoMixedPrecision runs first, at any level (it changes what the products compute).
  bool auto_mixed_precision = false;
  DType mixed_precision = DType::kBF16;  // ... in kBF16 or kF16
  // What float32 MatMul and Gemm compute in, as torch.set_float32_matmul_precision says
  // (the MatMulPrecision pass, after AutoMixedPrecision, at any level): "highest" fp32; "high"
  // three bf16 products of the operands' heads and tails ("bf16x3": about 2^-16 relative error
  // per product) where the CPU has AMX-BF16, else fp32; "medium" bf16 products where it has
  // AVX512_BF16, else fp32. Anything else is a ValueError.
  std::string matmul_precision = "highest";
  // The same for float32 Conv, as torch.backends.mkldnn.conv.fp32_precision says (its "ieee",
  // "tf32" and "bf16" are "highest", "high" and "medium" here; the ConvPrecision pass, next):
  // depthwise convs stay fp32.
  std::string conv_precision = "highest";
  // Names of passes after which the graph is printed to stderr (in addition to PTO_DUMP_AFTER);
  // "all" prints after every pass. An unknown name is a ValueError listing the known ones.
  std::vector<std::string> dump_after;
  // When set, the pipeline of `level` is replaced by these passes, in order.
  std::vector<std::string> only;
  // FoldConstants leaves results larger than this unfolded (0: its own limit, 64 MiB). The
  // runtime's per-shape memory planning folds only shape arithmetic (a few KiB), not the masks
  // a sequence length makes constant.
  size_t max_folded_bytes = 0;
  // Called after each pass with its name, its place in the pipeline (1-based), the pipeline's
  // length and the graph it left (progress bars, pto compile --graph-after).
  std::function<void(const std::string& pass, size_t index, size_t count, const Graph& g)>
      after_pass;
};

// FoldConstants' evaluation of one node as infer_types' folder (graph.h): Shape and Size of a
// static shape, else the node's reference kernel on its inputs when every one is known, results
// of at most `max_bytes`. Nondeterministic ops, If, sequences and optionals are never folded.
NodeFolder constant_folder(size_t max_bytes);

// The passes an optimization level runs, in order (level 0: none).
std::vector<std::string> pipeline(int level);

// Runs the pipeline on `g`; `report`, when given, receives one entry per pass.
Graph run_passes(Graph g, const PassOptions& options, std::vector<PassReport>* report = nullptr);

}  // namespace pto
