// pto_conformance: runs ONNX backend node tests (written by write_cases.py) through the importer
// and the reference interpreter and compares with the expected outputs the onnx package ships.
// Each passing test is also exported, re-imported and rerun: the outputs must be bit-identical;
// and compiled at levels 0, 2 and 3 and run by the Executable, whose kernels must meet the same
// tolerance (a test whose nodes all fall back to the reference kernels is counted apart).
//
//   pto_conformance CASES_DIR [--filter SUBSTR]... [--floor N] [--json FILE]
//                   [--tolerances FILE] [--verbose]
//
// Each test is pass, fail (wrong answer, or an error on a supported op: a bug) or unsupported
// (an op, dtype or feature PyPTO does not implement). Exit status is 1 when any test fails or
// fewer than --floor tests pass. A progress bar shows on a terminal.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "onnx.pb.h"
#include "pto/executable.h"
#include "pto/onnx.h"
#include "pto/op_registry.h"
#include "pto/progress.h"
#include "pto/reference.h"

namespace fs = std::filesystem;
using pto::Tensor;

namespace {

enum class Status { kPass, kFail, kUnsupported };

struct Result {
  std::string name;
  Status status;
  std::string detail;
  int cpu_nodes = 0;  // nodes the Executable ran on the CPU backend (passing tests)
  // Per op of the imported graph: nodes on a CPU kernel, nodes on the reference kernels (level 0).
  std::map<std::string, std::array<int, 2>> node_backends;
};

// Compares one output with ONNX's backend-test rule |got - want| <= atol + rtol * |want|.
std::string compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.dtype() != want.dtype())
    return pto::cat("dtype ", pto::dtype_name(got.dtype()), ", expected ",
                    pto::dtype_name(want.dtype()));
  if (got.shape() != want.shape())
    return pto::cat("shape ", pto::dims_str(got.shape()), ", expected ",
                    pto::dims_str(want.shape()));
  bool exact = !pto::is_floating(want.dtype());
  // The expected values of low-precision tests were computed with a rounding after every step,
  // so they carry several ulps of error themselves: never ask for more than the dtype resolves
  // (bf16: rtol 1.6e-2 as in torch.testing, atol 1e-5).
  if (want.dtype() == pto::DType::kBF16) rtol = std::max(rtol, 1.6e-2), atol = std::max(atol, 1e-5);
  // f16: two step-by-step roundings of one formula (an op and its expanded graph) can land two
  // ulps apart, 2^-9 relative.
  if (want.dtype() == pto::DType::kF16) rtol = std::max(rtol, 2e-3), atol = std::max(atol, 1e-5);
  for (int64_t i = 0; i < want.numel(); ++i) {
    double g = got.item_as_double(i), w = want.item_as_double(i);
    if (std::isnan(w) && std::isnan(g)) continue;
    if (std::isinf(w) && g == w) continue;
    bool ok = exact ? g == w : std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok) return pto::cat("element ", i, " is ", g, ", expected ", w);
  }
  return "";
}

// Sequences and optionals: the same comparison element by element; an empty optional only
// matches an empty one.
std::string compare_values(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.kind() != want.kind()) return pto::cat(got.str(), ", expected ", want.str());
  if (want.kind() == pto::ValueKind::kNone) return "";
  if (want.kind() == pto::ValueKind::kTensor) return compare(got, want, rtol, atol);
  if (got.items().size() != want.items().size())
    return pto::cat(got.items().size(), " elements, expected ", want.items().size());
  for (size_t i = 0; i < want.items().size(); ++i) {
    std::string diff = compare(got.items()[i], want.items()[i], rtol, atol);
    if (!diff.empty()) return pto::cat("element ", i, ": ", diff);
  }
  return "";
}

// What each graph input or output is, as the model file declares it (a sequence or an optional
// is read from a SequenceProto or OptionalProto): only the kind flags are set.
struct DeclaredKinds {
  std::vector<pto::TensorType> inputs, outputs;
};

pto::TensorType kind_of(const ::onnx::TypeProto& tp) {
  pto::TensorType t;
  if (tp.has_optional_type()) {
    t.optional = true;
    t.sequence = tp.optional_type().elem_type().has_sequence_type();
  }
  t.sequence = t.sequence || tp.has_sequence_type();
  return t;
}

DeclaredKinds declared_kinds(const fs::path& model) {
  std::ifstream in(model, std::ios::binary);
  ::onnx::ModelProto m;
  DeclaredKinds k;
  if (!m.ParseFromIstream(&in)) return k;
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  for (const auto& vi : m.graph().input())
    if (!inits.count(vi.name())) k.inputs.push_back(kind_of(vi.type()));
  for (const auto& vi : m.graph().output()) k.outputs.push_back(kind_of(vi.type()));
  return k;
}

std::vector<Tensor> load_set(const fs::path& dir, const char* kind,
                             const std::vector<pto::TensorType>& types) {
  std::vector<Tensor> out;
  for (size_t k = 0;; ++k) {
    fs::path p = dir / pto::cat(kind, "_", k, ".pb");
    if (!fs::exists(p)) break;
    out.push_back(
        pto::onnx::load_value(p.string(), k < types.size() ? types[k] : pto::TensorType{}));
  }
  return out;
}

struct Tolerance {
  double atol = -1, rtol = -1;  // -1: keep the test's own
};

// tolerances.txt: "TEST atol=X rtol=Y  # why" lines for tests whose expected data is noisy.
std::map<std::string, Tolerance> read_overrides(const fs::path& file) {
  std::map<std::string, Tolerance> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream ss(line);
    std::string name, kv;
    if (!(ss >> name)) continue;
    Tolerance t;
    while (ss >> kv) {
      if (kv.rfind("atol=", 0) == 0) t.atol = std::stod(kv.substr(5));
      if (kv.rfind("rtol=", 0) == 0) t.rtol = std::stod(kv.substr(5));
    }
    out[name] = t;
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.kind() != b.kind()) return false;
  if (a.kind() == pto::ValueKind::kNone) return true;
  if (a.kind() == pto::ValueKind::kSequence) {
    if (a.items().size() != b.items().size()) return false;
    for (size_t i = 0; i < a.items().size(); ++i)
      if (!same_bits(a.items()[i], b.items()[i])) return false;
    return true;
  }
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// The exporter's check on a passing test: save the imported graph, load the bytes back, and
// require the same printed graph and bit-identical outputs on every data set. "" when it holds.
std::string round_trip(const pto::Graph& g, const std::vector<std::vector<Tensor>>& inputs,
                       const std::vector<std::vector<Tensor>>& outputs) {
  pto::Graph back = pto::onnx::load_from_bytes(pto::onnx::save_to_bytes(g), "", "exported");
  if (pto::print(back) != pto::print(g))
    return pto::cat("the re-imported graph prints differently:\n", pto::print(g), "vs\n",
                    pto::print(back));
  for (size_t n = 0; n < inputs.size(); ++n) {
    std::vector<Tensor> got = pto::reference::run(back, inputs[n]);
    if (got.size() != outputs[n].size()) return pto::cat(got.size(), " outputs after re-import");
    for (size_t k = 0; k < got.size(); ++k)
      if (!same_bits(got[k], outputs[n][k]))
        return pto::cat("data set ", n, " output ", k, " differs after re-import");
  }
  return "";
}

// The Executable (CPU kernels where the backend has them) on every data set, against the
// expected outputs: at level 0 (op by op), and at levels 2 and 3, where the graph passes, fusion
// and the memory plan change what runs. "" when every level holds.
std::string run_backend(const fs::path& dir, const pto::Graph& g,
                        const std::vector<std::vector<Tensor>>& inputs, double rtol, double atol,
                        const DeclaredKinds& kinds, Result& r) {
  for (int level : {0, 2, 3}) {
    pto::Executable exe = pto::compile(g, {.level = level});
    if (level == 0)
      for (size_t i = 0; i < g.nodes().size(); ++i) {
        bool cpu = exe.node_backend(i) == "cpu";
        r.cpu_nodes += cpu;
        ++r.node_backends[g.nodes()[i].op][cpu ? 0 : 1];
      }
    for (size_t n = 0; n < inputs.size(); ++n) {
      std::vector<Tensor> got = exe.run(inputs[n]);
      std::vector<Tensor> want =
          load_set(dir / pto::cat("test_data_set_", n), "output", kinds.outputs);
      if (got.size() != want.size()) return pto::cat("level ", level, ": ", got.size(), " outputs");
      for (size_t k = 0; k < want.size(); ++k) {
        std::string diff = compare_values(got[k], want[k], rtol, atol);
        if (!diff.empty())
          return pto::cat("level ", level, " data set ", n, " output ", k, ": ", diff);
      }
    }
  }
  return "";
}

Result run_case(const fs::path& dir, const Tolerance& override_tol) {
  Result r{dir.filename().string(), Status::kPass, ""};
  double rtol = 1e-3, atol = 1e-7;
  std::ifstream(dir / "tolerance.txt") >> rtol >> atol;
  if (override_tol.atol >= 0) atol = override_tol.atol;
  if (override_tol.rtol >= 0) rtol = override_tol.rtol;
  try {
    pto::Graph g = pto::onnx::load((dir / "model.onnx").string());
    if (fs::exists(dir / "UNSUPPORTED")) {
      std::ifstream in(dir / "UNSUPPORTED");
      std::getline(in, r.detail);
      r.status = Status::kUnsupported;
      return r;
    }
    const DeclaredKinds kinds = declared_kinds(dir / "model.onnx");
    std::vector<std::vector<Tensor>> all_inputs, all_outputs;  // for the round trip
    for (int n = 0;; ++n) {
      fs::path ds = dir / pto::cat("test_data_set_", n);
      if (!fs::exists(ds)) break;
      std::vector<Tensor> inputs = load_set(ds, "input", kinds.inputs);
      std::vector<Tensor> want = load_set(ds, "output", kinds.outputs);
      // Every value's inferred kind, dtype and known dimensions must match what the kernels
      // produce (each element of a sequence; an empty optional only its kind).
      auto matches = [](const pto::TensorType& t, const Tensor& x) {
        bool ok = t.dtype == pto::DType::kUndefined || t.dtype == x.dtype();
        if (t.shape) {
          ok = ok && t.shape->size() == x.shape().size();
          for (size_t k = 0; ok && k < t.shape->size(); ++k)
            ok = !(*t.shape)[k].is_known() || (*t.shape)[k].value == x.shape()[k];
        }
        return ok;
      };
      std::string infer_error;
      auto check_types = [&](const pto::Node& node, const std::vector<Tensor>& outs) {
        for (size_t o = 0; o < outs.size() && infer_error.empty(); ++o) {
          if (node.outputs[o] == pto::kNoValue || !outs[o].defined()) continue;
          const pto::TensorType& t = g.value(node.outputs[o]).type;
          const Tensor& x = outs[o];
          bool ok = x.kind() == pto::ValueKind::kNone
                        ? t.optional
                        : t.sequence == (x.kind() == pto::ValueKind::kSequence);
          if (ok && x.kind() == pto::ValueKind::kSequence)
            for (const Tensor& e : x.items()) ok = ok && matches(t, e);
          if (ok && x.is_tensor()) ok = matches(t, x);
          if (!ok)
            infer_error = pto::cat(node.where(), " output ", o, ": inferred ", t.str(),
                                   ", computed ", x.str());
        }
      };
      std::vector<Tensor> got = pto::reference::run(g, inputs, check_types);
      if (!infer_error.empty()) {
        r.status = Status::kFail;
        r.detail = "type inference: " + infer_error;
        return r;
      }
      if (got.size() != want.size()) {
        r.status = Status::kFail;
        r.detail = pto::cat(got.size(), " outputs, expected ", want.size());
        return r;
      }
      for (size_t k = 0; k < want.size(); ++k) {
        std::string diff = compare_values(got[k], want[k], rtol, atol);
        if (!diff.empty()) {
          r.status = Status::kFail;
          r.detail = pto::cat("output ", k, ": ", diff);
          return r;
        }
      }
      all_inputs.push_back(std::move(inputs));
      all_outputs.push_back(std::move(got));
    }
    std::string trip = round_trip(g, all_inputs, all_outputs);
    if (!trip.empty()) {
      r.status = Status::kFail;
      r.detail = "export round trip: " + trip;
      return r;
    }
    std::string backend = run_backend(dir, g, all_inputs, rtol, atol, kinds, r);
    if (!backend.empty()) {
      r.status = Status::kFail;
      r.detail = "CPU backend: " + backend;
    }
  } catch (const pto::UnsupportedError& e) {
    r.status = Status::kUnsupported;
    r.detail = e.what();
  } catch (const std::exception& e) {
    r.status = Status::kFail;
    r.detail = e.what();
  }
  return r;
}

// Ops a test uses, read from the model even when import fails (for the per-op summary).
std::set<std::string> ops_of(const fs::path& dir) {
  std::ifstream in(dir / "model.onnx", std::ios::binary);
  ::onnx::ModelProto m;
  std::set<std::string> ops;
  if (m.ParseFromIstream(&in))
    for (const auto& n : m.graph().node()) ops.insert(n.op_type());
  return ops;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: pto_conformance CASES_DIR [--filter S]... [--floor N] [--json FILE] "
                 "[--verbose]\n";
    return 2;
  }
  fs::path root = argv[1];
  std::vector<std::string> filters;
  long floor = 0;
  std::string json;
  fs::path tolerances = PTO_DEFAULT_TOLERANCES;
  bool verbose = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--filter" && i + 1 < argc)
      filters.push_back(argv[++i]);
    else if (a == "--floor" && i + 1 < argc)
      floor = std::stol(argv[++i]);
    else if (a == "--json" && i + 1 < argc)
      json = argv[++i];
    else if (a == "--tolerances" && i + 1 < argc)
      tolerances = argv[++i];
    else if (a == "--verbose" || a == "-v")
      verbose = true;
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    std::string name = e.path().filename().string();
    bool keep = filters.empty() || std::any_of(filters.begin(), filters.end(), [&](auto& f) {
                  return name.find(f) != std::string::npos;
                });
    if (keep) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());

  std::map<std::string, Tolerance> overrides = read_overrides(tolerances);
  std::vector<Result> results;
  std::map<std::string, std::array<int, 3>> by_op;  // pass, fail, unsupported
  int counts[3] = {0, 0, 0};
  int covered = 0;     // tests whose ops all have an OpDef
  int on_backend = 0;  // passing tests with at least one node on the CPU backend
  // Per op (of the imported graphs), over passing tests: nodes on a CPU kernel, nodes on the
  // reference kernels, tests with a node of it on the reference kernels.
  std::map<std::string, std::array<int, 3>> op_backends;
  const auto& registry = pto::OpRegistry::global();
  pto::ProgressBar bar("ONNX node tests");
  for (const auto& d : dirs) {
    bar.update(results.size(), dirs.size(), d.filename().string());
    auto it = overrides.find(d.filename().string());
    Result r = run_case(d, it == overrides.end() ? Tolerance{} : it->second);
    int s = static_cast<int>(r.status);
    ++counts[s];
    on_backend += r.status == Status::kPass && r.cpu_nodes > 0;
    if (r.status == Status::kPass)
      for (const auto& [op, n] : r.node_backends) {
        op_backends[op][0] += n[0];
        op_backends[op][1] += n[1];
        op_backends[op][2] += n[1] > 0;
      }
    std::set<std::string> ops = ops_of(d);
    for (const auto& op : ops) ++by_op[op][s];
    covered += std::all_of(ops.begin(), ops.end(),
                           [&](const std::string& op) { return registry.find(op) != nullptr; });
    if (r.status == Status::kFail || verbose) bar.finish();  // lines of their own, not under it
    if (r.status == Status::kFail) std::cout << "FAIL " << r.name << ": " << r.detail << "\n";
    if (verbose && r.status == Status::kUnsupported)
      std::cout << "UNSUPPORTED " << r.name << ": " << r.detail << "\n";
    if (verbose && r.status == Status::kPass)
      std::cout << "PASS " << r.name << (r.cpu_nodes ? "" : " (reference kernels only)") << "\n";
    results.push_back(std::move(r));
  }

  bar.finish();
  std::cout << "\nBy op (tests using it: pass / fail / unsupported)\n";
  for (const auto& [op, c] : by_op)
    if (c[0] + c[1] > 0 || verbose)
      std::printf("  %-28s %4d %4d %4d\n", op.c_str(), c[0], c[1], c[2]);
  // The long tail: ops whose nodes in passing tests ran on the reference interpreter's kernels
  // (whole op, or some dtypes / attributes). Shape arithmetic that compile() folds never runs.
  std::cout << "\nOn the reference kernels (nodes of passing tests at level 0: cpu / reference,"
               " tests)\n";
  for (const auto& [op, c] : op_backends)
    if (c[1] > 0) std::printf("  %-28s %4d %4d %4d\n", op.c_str(), c[0], c[1], c[2]);
  int total = static_cast<int>(results.size());
  std::printf("\nONNX node tests: %d total, %d pass (%.1f%%), %d fail, %d unsupported\n", total,
              counts[0], total ? 100.0 * counts[0] / total : 0.0, counts[1], counts[2]);
  std::printf("Op coverage: %d of %d tests (%.1f%%) use only supported ops\n", covered, total,
              total ? 100.0 * covered / total : 0.0);
  std::printf("CPU backend: %d passing tests ran at least one node on a CPU kernel\n", on_backend);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"total\": " << total << ", \"pass\": " << counts[0] << ", \"fail\": " << counts[1]
        << ", \"unsupported\": " << counts[2] << ", \"covered\": " << covered
        << ", \"on_cpu_backend\": " << on_backend << "}\n";
  }
  bool ok = counts[1] == 0 && counts[0] >= floor;
  if (counts[0] < floor)
    std::cout << "pass count " << counts[0] << " is below the recorded floor " << floor << "\n";
  std::printf("conformance: %d passed, %d failed\n", counts[0], counts[1]);
  return ok ? 0 : 1;
}
