// `pto check`: compile a model, run it keeping every value its kernels write, run the reference
// interpreter on the original graph, and compare every value both have, by ONNX value name. The
// first node (in the original graph's order) whose value is beyond tolerance is the error.
#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "cli.h"
#include "inputs.h"
#include "pto/compare.h"
#include "pto/executable.h"
#include "pto/onnx.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto::cli {
namespace {

const char* kUsage =
    "usage: pto check model.onnx [--level L] [--threads N] [--rtol R] [--atol A]\n"
    "                 [--input NAME=FILE.npy ...] [--dim SYMBOL=VALUE ...] [--seed N]\n"
    "\n"
    "Compiles the model (as 'pto run' does), runs it keeping every value its kernels write,\n"
    "runs the reference interpreter on the original graph, and compares every value that both\n"
    "have (by ONNX value name). Prints one row per compared value with its largest absolute and\n"
    "relative errors, and exits 1 naming the first node, in the model's order, whose value is\n"
    "beyond tolerance: |compiled - reference| > atol + rtol * |reference| (torch.allclose's\n"
    "rule; NaN matches only NaN, an infinity only the same infinity). Values computed inside a\n"
    "fused kernel, folded away or renamed by a pass are not compared (the summary counts them).\n"
    "\n"
    "options:\n"
    "  --level L              optimization level 0..3 (default 2)\n"
    "  --no-tune-cache        ignore the tuning cache: the planner's knobs only\n"
    "  --threads N            run kernels on N threads\n"
    "  --rtol R               relative tolerance (default 1e-3)\n"
    "  --atol A               absolute tolerance (default 1e-4)\n"
    "  --input NAME=FILE.npy  feed graph input NAME from a .npy file (else random, as 'pto run')\n"
    "  --dim SYMBOL=VALUE     the size of a symbolic dimension for random inputs (default 1)\n"
    "  --seed N               seed of the random inputs (default 0)\n";

struct Options {
  std::string model;
  InputSpec inputs;
  int level = 2;
  double rtol = 1e-3, atol = 1e-4;
};

double double_value(ArgReader& a, const char* option) {
  const std::string v = a.value();
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x >= 0) || x == INFINITY)
    a.fail(cat(option, " expects a non-negative number, got '", v, "'"));
  return x;
}

std::optional<Options> parse(const std::vector<std::string>& args) {
  Options o;
  ArgReader a(args, "check");
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return std::nullopt;
    } else if (read_input_option(a, o.inputs)) {
    } else if (read_tune_cache_option(a)) {
    } else if (a.is("--level")) {
      o.level = static_cast<int>(a.int_value(0, 3));
    } else if (a.is("--threads")) {
      set_num_threads(static_cast<int>(a.int_value(1, 4096)));
    } else if (a.is("--rtol")) {
      o.rtol = double_value(a, "--rtol");
    } else if (a.is("--atol")) {
      o.atol = double_value(a, "--atol");
    } else if (a.positional() && o.model.empty()) {
      o.model = a.arg();
    } else {
      a.unknown();
    }
  }
  if (o.model.empty()) a.fail("no model file given");
  return o;
}

struct Row {
  std::string node, op, value, type;
  TensorDiff diff;
  Dims shape;
  std::string note;  // why it was not compared, else ""
};

// A level 3 value in the channel-blocked layout ([N, C/c, H, W, c], named "<value>_blocked" by
// AssignLayouts) back in the model's NCHW layout, by the reference's own ReorderFromBlocked;
// undefined when `blocked` is not that value in that layout.
Tensor unblocked(const Tensor& blocked, const Tensor& want) {
  if (blocked.rank() != 5 || want.rank() != 4 || blocked.dtype() != want.dtype()) return {};
  const Dims& b = blocked.shape();
  const Dims& w = want.shape();
  const int64_t c = b[4];
  if (b[0] != w[0] || b[2] != w[2] || b[3] != w[3] || c < 1 || b[1] != (w[1] + c - 1) / c)
    return {};
  Graph g;
  ValueId in = g.add_input("blocked", {blocked.dtype(), Shape(b.begin(), b.end())});
  ValueId out = g.add_value("nchw");
  Attributes attrs;
  attrs.set("channels", w[1]);
  g.add_node("ReorderFromBlocked", {in}, {out}, attrs, "unblock").domain = "pto";
  g.add_output(out);
  return reference::run(g, {blocked})[0];
}

// A copy of a value that outlives the run (the executable reuses its buffers): a sequence's
// elements are copied one by one; an empty optional is kept as it is.
Tensor kept(const Tensor& t) {
  if (t.kind() == ValueKind::kNone) return t;
  if (t.kind() == ValueKind::kTensor) return t.clone();
  std::vector<Tensor> items;
  for (const Tensor& item : t.items()) items.push_back(kept(item));
  return Tensor::sequence(std::move(items));
}

std::string sci(double x) {
  std::ostringstream os;
  os.precision(2);
  os << std::scientific << x;
  return os.str();
}

void print_table(const std::vector<Row>& rows) {
  const char* heads[] = {"node", "op", "value", "type"};
  size_t w[4] = {4, 2, 5, 4};
  for (const Row& r : rows) {
    w[0] = std::max(w[0], r.node.size());
    w[1] = std::max(w[1], r.op.size());
    w[2] = std::max(w[2], r.value.size());
    w[3] = std::max(w[3], r.type.size());
  }
  for (size_t& x : w) x = std::min<size_t>(x, 48);
  auto cell = [](const std::string& s, size_t width) {
    std::string t = s.size() > width ? "..." + s.substr(s.size() - (width - 3)) : s;
    return t + std::string(width - t.size() + 2, ' ');
  };
  for (int i = 0; i < 4; ++i) std::cout << cell(heads[i], w[i]);
  std::cout << "max abs   max rel   mismatches\n";
  for (const Row& r : rows) {
    std::cout << cell(r.node, w[0]) << cell(r.op, w[1]) << cell(r.value, w[2])
              << cell(r.type, w[3]);
    if (!r.note.empty()) {
      std::cout << r.note << "\n";
      continue;
    }
    std::cout << sci(r.diff.max_abs) << "  " << sci(r.diff.max_rel) << "  " << r.diff.mismatches
              << (r.diff.ok() ? "" : "  <- beyond tolerance") << "\n";
  }
}

int check_main(const std::vector<std::string>& args) {
  auto opts = parse(args);
  if (!opts) return 0;
  const Options& o = *opts;
  Graph g = onnx::load(o.model);
  std::vector<Tensor> inputs = make_inputs(g, o.inputs);
  Executable exe = compile(g, {.level = o.level});

  // The compiled run: every value a kernel wrote, by name (copied: nothing is reused later).
  std::map<std::string, Tensor> compiled;
  const Graph& cg = exe.graph();
  exe.run_observing_values(inputs, [&](ValueId v, const Tensor& t) {
    if (t.defined()) compiled[cg.value(v).name] = kept(t);
  });

  // The reference run on the original graph, compared value by value as it goes.
  std::vector<Row> rows;
  size_t values = 0;
  reference::run(g, inputs, [&](const Node& n, const std::vector<Tensor>& outs) {
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i) {
      if (n.outputs[i] == kNoValue || !outs[i].defined()) continue;
      values += outs[i].kind() == ValueKind::kSequence ? outs[i].items().size() : 1;
      const std::string& name = g.value(n.outputs[i]).name;
      auto it = compiled.find(name);
      if (it == compiled.end()) {  // level 3: the value may be there in the blocked layout
        it = compiled.find(name + "_blocked");
        if (it == compiled.end()) continue;
        Tensor nchw = unblocked(it->second, outs[i]);
        if (nchw.defined()) it->second = nchw;
      }
      // One row a tensor; a sequence's elements are compared one by one, as name[k].
      auto add_row = [&](const std::string& value, const Tensor& got, const Tensor& want) {
        Row r{n.name, n.op, value, want.str(), {}, want.shape(), ""};
        if (got.kind() != want.kind() || want.kind() == ValueKind::kSequence ||
            got.dtype() != want.dtype() || got.shape() != want.shape())
          r.note = cat("not compared: the compiled value is ", got.str());
        else if (want.kind() == ValueKind::kNone)
          r.note = "both empty optionals";
        else
          r.diff = compare(got, want, o.rtol, o.atol, cat("value '", value, "'"));
        rows.push_back(std::move(r));
      };
      const Tensor &got = it->second, &want = outs[i];
      if (want.kind() == ValueKind::kSequence && got.kind() == ValueKind::kSequence &&
          got.items().size() == want.items().size()) {
        for (size_t k = 0; k < want.items().size(); ++k)
          add_row(cat(name, "[", k, "]"), got.items()[k], want.items()[k]);
      } else {
        add_row(name, got, want);
      }
      compiled.erase(it);
    }
  });

  std::cout << "check: " << o.model << ", level " << o.level << ", " << num_threads()
            << " threads, rtol " << o.rtol << ", atol " << o.atol << "\n";
  print_table(rows);
  const Row* first = nullptr;
  size_t compared = 0, bad = 0;
  for (const Row& r : rows) {
    if (!r.note.empty()) continue;
    ++compared;
    if (!r.diff.ok()) {
      ++bad;
      if (!first) first = &r;
    }
  }
  std::cout << "compared " << compared << " of " << values << " values of the model ("
            << values - compared
            << " not compared: inside fused kernels, folded or renamed by the passes, or in "
               "another layout)\n";
  if (first)
    throw ValueError(cat(bad, " value(s) differ beyond tolerance; the first is at node '",
                         first->node, "' (", first->op, "), value '", first->value,
                         "': ", describe(first->diff, first->shape)));
  std::cout << "ok: every compared value is within tolerance\n";
  return 0;
}

}  // namespace

Command check_command() {
  return {"check", "Compare the compiled model with the reference interpreter, value by value.",
          kUsage, check_main};
}

}  // namespace pto::cli
