// Model inputs for `pto run`, `check` and `bench` (inputs.h).
#include "inputs.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <random>
#include <set>

#include "pto/npy.h"
#include "pto/onnx.h"
#include "run_util.h"

namespace pto::cli {

namespace {

// Input `name` (declared `type`) from what --input gave: a .pb file is ONNX test data (a
// TensorProto, SequenceProto or OptionalProto, as in a node test's test_data_set_0), read as the
// declared type; otherwise .npy, and for a sequence input a comma-separated list of .npy files,
// one per element.
Tensor read_input(const std::string& file, const TensorType& type, const std::string& name) {
  if (file.ends_with(".pb")) return onnx::load_value(file, type);
  if (!type.sequence) return read_npy(file);
  std::vector<Tensor> items;
  for (size_t begin = 0;;) {
    const size_t end = std::min(file.find(',', begin), file.size());
    const std::string part = file.substr(begin, end - begin);
    if (part.empty())
      throw ValueError(cat("--input ", name, "=", file,
                           ": an empty file name in the list (a sequence input takes "
                           "a.npy,b.npy, one file per element; an empty sequence only as .pb)"));
    items.push_back(read_npy(part));
    if (end == file.size()) break;
    begin = end + 1;
  }
  return Tensor::sequence(std::move(items));
}

// The sizes `t` (a tensor, or each element of a sequence) gives the symbols of `shape`; the
// first value a symbol gets wins.
void bind_symbols(const Tensor& t, const std::optional<Shape>& shape,
                  std::map<std::string, int64_t>& symbols) {
  if (t.kind() == ValueKind::kSequence) {
    for (const Tensor& item : t.items()) bind_symbols(item, shape, symbols);
    return;
  }
  if (!t.is_tensor() || !shape || shape->size() != static_cast<size_t>(t.rank())) return;
  for (size_t k = 0; k < shape->size(); ++k)
    if ((*shape)[k].is_symbolic()) symbols.emplace((*shape)[k].symbol, t.shape()[k]);
}

}  // namespace

bool read_input_option(ArgReader& a, InputSpec& spec) {
  if (a.is("--input")) {
    auto in = split_assignment(a.value(), "--input", a);
    for (const auto& prev : spec.files)
      if (prev.first == in.first) a.fail(cat("--input ", in.first, " is given twice"));
    spec.files.push_back(std::move(in));
  } else if (a.is("--dim")) {
    auto [sym, v] = split_assignment(a.value(), "--dim", a);
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || errno == ERANGE || n < 0)
      a.fail(cat("--dim ", sym, ": expected a non-negative integer, got '", v, "'"));
    spec.dims[sym] = n;
  } else if (a.is("--seed")) {
    spec.seed = static_cast<uint64_t>(a.int_value(0, INT64_MAX));
  } else {
    return false;
  }
  return true;
}

std::vector<Tensor> make_inputs(const Graph& g, const InputSpec& o) {
  std::map<std::string, std::string> files(o.files.begin(), o.files.end());
  std::vector<std::string> names;
  for (ValueId v : g.inputs()) names.push_back(g.value(v).name);
  for (const auto& [name, file] : o.files) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "'" : ", '") + n + "'";
      throw ValueError(cat("--input ", name, ": the model has no input named '", name,
                           "' (its inputs: ", list.empty() ? "none" : list, ")"));
    }
  }

  // Symbol sizes: --dim first, then whatever the given files say.
  std::map<std::string, int64_t> symbols = o.dims;
  std::vector<Tensor> out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto f = files.find(names[i]);
    if (f == files.end()) continue;
    const TensorType& type = g.value(g.inputs()[i]).type;
    out[i] = read_input(f->second, type, names[i]);
    bind_symbols(out[i], type.shape, symbols);
    std::cout << "input  " << names[i] << ": " << out[i].str() << " from " << f->second << "\n";
  }

  std::set<std::string> used;
  std::mt19937_64 rng(o.seed);
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorType& type = g.value(g.inputs()[i]).type;
    if (type.shape)
      for (const Dim& d : *type.shape)
        if (d.is_symbolic()) used.insert(d.symbol);
    if (out[i].defined()) continue;
    std::string where = cat("input '", names[i], "'");
    if (type.optional) {  // not given: the empty optional, as ONNX Runtime runs it
      out[i] = Tensor::none();
      std::cout << "input  " << names[i] << ": none (an optional input, not given: empty)\n";
      continue;
    }
    if (type.sequence)
      throw ValueError(cat(where, ": a sequence of tensors; give it with --input ", names[i],
                           "=a.npy,b.npy (one file per element) or ", names[i], "=FILE.pb"));
    if (type.dtype == DType::kUndefined || !type.shape)
      throw ValueError(cat(where, ": the model does not declare its ",
                           type.dtype == DType::kUndefined ? "element type" : "shape",
                           "; give it with --input ", names[i], "=FILE.npy"));
    Dims dims;
    for (size_t k = 0; k < type.shape->size(); ++k) {
      const Dim& d = (*type.shape)[k];
      if (d.is_known()) {
        dims.push_back(d.value);
      } else if (d.is_symbolic() && symbols.count(d.symbol)) {
        dims.push_back(symbols[d.symbol]);
      } else {
        if (d.is_symbolic()) {
          std::cerr << "note: dimension '" << d.symbol << "' set to 1 (use --dim " << d.symbol
                    << "=N)\n";
          symbols[d.symbol] = 1;
        } else {
          std::cerr << "note: dimension " << k << " of " << where
                    << " is unnamed and unknown; using 1 (give the input with --input)\n";
        }
        dims.push_back(1);
      }
    }
    out[i] = random_tensor(type.dtype, dims, rng);
    std::cout << "input  " << names[i] << ": " << out[i].str() << " random (seed " << o.seed
              << ")\n";
  }
  for (const auto& [sym, v] : o.dims)
    if (!used.count(sym))
      std::cerr << "note: --dim " << sym << ": no input of the model has this dimension\n";
  return out;
}

}  // namespace pto::cli
