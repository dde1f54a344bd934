// The pass manager: the registry of passes, the pipeline of each optimization level, and
// run_passes, which runs a pipeline with types re-inferred, the verifier run, the time taken and
// the rewrites fired recorded after every pass, and dumps the graph where PTO_DUMP_AFTER asks;
// PTO_VERIFY_PASSES=1 reruns the reference after every pass (verify_passes.h).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>

#include "passes/passes.h"
#include "passes/verify_passes.h"
#include "pto/log.h"

namespace pto {

PassRegistry& PassRegistry::global() {
  static PassRegistry* registry = [] {
    auto* r = new PassRegistry();
    passes::register_eliminate_dead_code(*r);
    passes::register_resolve_shapes(*r);
    passes::register_unflatten_mat_mul(*r);
    passes::register_canonicalize_ops(*r);
    passes::register_fold_batch_norm(*r);
    passes::register_fold_transpose_into_gemm(*r);
    passes::register_recognize_composites(*r);
    passes::register_recognize_attention(*r);
    passes::register_recognize_rotary_embedding(*r);
    passes::register_fold_constants(*r);
    passes::register_eliminate_no_ops(*r);
    passes::register_simplify_transposes(*r);
    passes::register_eliminate_common_subexpressions(*r);
    passes::register_assign_layouts(*r);
    passes::register_fuse_blocked_convs(*r);
    passes::register_auto_mixed_precision(*r);
    passes::register_mat_mul_precision(*r);
    passes::register_conv_precision(*r);
    passes::register_store_half_operands(*r);
    passes::register_promote_half(*r);
    passes::register_fuse_dynamic_quantization(*r);
    passes::register_lower_qdq_to_integer(*r);
    passes::register_lower_qlinear_ops(*r);
    passes::register_merge_sibling_mat_muls(*r);
    passes::register_fold_attention_heads(*r);
    passes::register_lower_conv3d(*r);
    passes::register_lower_einsum(*r);
    passes::register_fuse_gather_mat_mul(*r);
    passes::register_fuse_channel_moves(*r);
    return r;
  }();
  return *registry;
}

void PassRegistry::add(PassDef def) {
  const std::string name = def.name;
  passes_.add(name, std::move(def));
}

std::vector<std::string> pipeline(int level) {
  if (level <= 0) return {};
  // Level 1: clean-up that keeps every value's bits. Names absent from the registry (a pass not
  // built yet) are skipped, so the list below is the whole intended order.
  std::vector<std::string> order = {
      "CanonicalizeOps",
      "FoldConstants",
      "ResolveShapes",
      "UnflattenMatMul",
      "EliminateNoOps",
      "SimplifyTransposes",
      "FoldBatchNorm",
      "FoldTransposeIntoGemm",
      "RecognizeComposites",
      "RecognizeRotaryEmbedding",
      "RecognizeAttention",
      "FuseDynamicQuantization",
      "EliminateCommonSubexpressions",
      "FoldAttentionHeads",
      "FuseChannelMoves",
      "EliminateDeadCode",
  };
  // Level 2: QDQ-quantized products on the integer kernels (rounding moves by float ulps),
  // first, before FoldConstants turns the dequantized weights into float ones; before that,
  // onnxruntime's QOperator ops as QDQ (a result can move by one step of its grid).
  if (level >= 2) order.insert(order.begin(), {"LowerQLinearOps", "LowerQdqToInteger"});
  // Level 2: products of one activation by constant weights as one wider GEMM (the GEMM's
  // blocking may move a result by rounding); after RecognizeAttention, which then already holds
  // Q, K and V, and after EliminateCommonSubexpressions, which makes the flattening Reshape an
  // exporter writes before each projection one value; EliminateDeadCode drops the old weights.
  // FoldAttentionHeads (level 1: Attention reads its heads in place) comes after it, to take
  // the merged product's Split in too.
  if (level >= 2) {
    const auto at = std::find(order.begin(), order.end(), "FoldAttentionHeads");
    order.insert(at, "MergeSiblingMatMuls");
  }
  // Level 2: 3-D convs as 2-D ones over depth windows (the conv kernels' summation order), after
  // FoldBatchNorm, which folds a BN into the 3-D conv's weights.
  if (level >= 2) {
    const auto at = std::find(order.begin(), order.end(), "FoldBatchNorm");
    order.insert(at + 1, "LowerConv3D");
  }
  // Level 2: Einsums as MatMuls (the GEMM's summation order), once ResolveShapes has given
  // their operands' shapes and before the passes that fold transposes into products and
  // recognize attention in them.
  if (level >= 2) {
    const auto at = std::find(order.begin(), order.end(), "ResolveShapes");
    order.insert(at + 1, "LowerEinsum");
  }
  // Level 2: products of rows by per-row gathered matrices (mixture-of-experts layers) as one
  // GatherMatMul, once FoldConstants has made the experts' weights constants; EliminateDeadCode
  // then drops the gathers.
  if (level >= 2) {
    const auto at = std::find(order.begin(), order.end(), "EliminateDeadCode");
    order.insert(at, "FuseGatherMatMul");
  }
  // Level 2: activations read only by bf16/f16 products stored in that type (fused casts).
  if (level >= 2) order.push_back("StoreHalfOperands");
  // Level 3: layouts (blocked channels where the CPU's blocked kernels pay), on the cleaned graph.
  if (level >= 3) {
    order.push_back("AssignLayouts");
    order.push_back("FuseBlockedConvs");
  }
  std::vector<std::string> out;
  for (const std::string& name : order)
    if (PassRegistry::global().find(name)) out.push_back(name);
  return out;
}

namespace {

std::vector<std::string> split_names(const char* s) {
  std::vector<std::string> out;
  if (!s) return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

void check_known(const std::vector<std::string>& names, const char* what) {
  for (const std::string& n : names) {
    if (n == "all" || PassRegistry::global().find(n)) continue;
    std::string known;
    for (const std::string& k : PassRegistry::global().names())
      known += (known.empty() ? "" : ", ") + k;
    throw ValueError(cat(what, ": unknown pass '", n, "' (passes: ", known, ")"));
  }
}

}  // namespace

Graph run_passes(Graph g, const PassOptions& options, std::vector<PassReport>* report) {
  std::vector<std::string> names = options.only.empty() ? pipeline(options.level) : options.only;
  for (const auto& [what, value] : {std::pair{"matmul_precision", &options.matmul_precision},
                                    std::pair{"conv_precision", &options.conv_precision}})
    if (*value != "highest" && *value != "high" && *value != "medium")
      throw ValueError(cat(what,
                           " must be 'highest', 'high' or 'medium' (the names of "
                           "torch.set_float32_matmul_precision), got '",
                           *value, "'"));
  if (options.conv_precision != "highest" && options.only.empty())
    names.insert(names.begin(), "ConvPrecision");
  if (options.matmul_precision != "highest" && options.only.empty())
    names.insert(names.begin(), "MatMulPrecision");
  if (options.auto_mixed_precision && options.only.empty())
    names.insert(names.begin(), "AutoMixedPrecision");
  // A graph computing in bf16 or f16 runs on the fp32 kernels with half-precision products
  // (PromoteHalf), first, at any level: the CPU kernels have no other bf16 or f16 arithmetic.
  if (options.only.empty() && passes::has_half_values(g))
    names.insert(names.begin(), "PromoteHalf");
  check_known(options.only, "passes");
  std::vector<std::string> dump = options.dump_after;
  for (std::string& n : split_names(std::getenv("PTO_DUMP_AFTER"))) dump.push_back(n);
  check_known(dump, "dump-after");
  // PTO_DISABLE_PASSES=A,B leaves passes out of the level's pipeline (to bisect a problem, or to
  // measure what a pass buys); a name that is not a pass is an error, never ignored.
  const std::vector<std::string> disabled = split_names(std::getenv("PTO_DISABLE_PASSES"));
  check_known(disabled, "PTO_DISABLE_PASSES");
  std::erase_if(names, [&](const std::string& n) {
    return std::find(disabled.begin(), disabled.end(), n) != disabled.end();
  });
  auto dumps = [&](const std::string& name) {
    return std::find(dump.begin(), dump.end(), name) != dump.end() ||
           std::find(dump.begin(), dump.end(), "all") != dump.end();
  };

  // PTO_VERIFY_PASSES=1: the reference runs the graph after every pass (verify_passes.h).
  const std::optional<passes::PassVerifier> verifier =
      names.empty() ? std::nullopt : passes::PassVerifier::from_env(g);

  for (const std::string& name : names) {
    const PassDef* pass = PassRegistry::global().find(name);
    PTO_CHECK(pass) << "pass '" << name << "' is not registered";
    PassContext ctx;
    ctx.level = options.level;
    ctx.max_folded_bytes = options.max_folded_bytes;
    ctx.mixed_precision = options.mixed_precision;
    ctx.matmul_precision = options.matmul_precision;
    ctx.conv_precision = options.conv_precision;
    PassReport r{name, 0, g.nodes().size(), 0, {}};
    // A pass that leaves the graph as it was cannot change results: verifying needs the copy.
    std::optional<Graph> before;
    if (verifier) before = g;
    auto t0 = std::chrono::steady_clock::now();
    g = pass->run(std::move(g), ctx);
    try {
      verify(g);
      infer_types(g);
    } catch (const Error& e) {
      throw InternalError(cat("pass ", name, " left an invalid graph: ", e.what()));
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.nodes_after = g.nodes().size();
    r.fired = std::move(ctx.fired);
    if (log_enabled(LogLevel::kInfo)) {
      std::string fired;
      for (const auto& [rule, count] : r.fired) fired += cat(" ", rule, " x", count);
      log(LogLevel::kInfo,
          cat("pass ", name, ": ", r.nodes_before, " -> ", r.nodes_after, " nodes in ",
              static_cast<int>(r.seconds * 1e6), " us", fired.empty() ? "" : ";", fired));
    }
    if (dumps(name)) std::cerr << "// after " << name << "\n" << print(g) << std::flush;
    if (verifier && !structurally_equal(*before, g)) verifier->check(name, g);
    if (options.after_pass)
      options.after_pass(name, static_cast<size_t>(&name - names.data()) + 1, names.size(), g);
    if (report) report->push_back(std::move(r));
  }
  return g;
}

}  // namespace pto
